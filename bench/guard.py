"""``python -m bench.guard PARENT_PID CMD ...``: run CMD so that it dies with the runner.

Trial processes start in a session of their own (so a timeout can kill the whole group, compile workers and
torchrun ranks included), which also means nothing ends them when the runner is killed with ``kill -9``: a trial
ran on for seconds after its runner died, holding the cores of whatever ran next. This wrapper asks the kernel to
send SIGTERM to the process when its parent dies (``PR_SET_PDEATHSIG``, kept across ``exec``), checks that the
parent is still the runner (it may have died before the request), then becomes CMD. SIGTERM ends a trial process
at once and makes torchrun stop its ranks. Linux only; elsewhere CMD runs unguarded.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.guard PARENT_PID CMD [ARG ...]", file=sys.stderr)
        return 2
    parent, cmd = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the runner died before the request took effect
            return 1
    os.execv(cmd[0], cmd)
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
