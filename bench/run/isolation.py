"""How a trial's process starts: forked from the sweep's fork server (``fork``, the default) or a fresh interpreter.

Under ``fork`` the runner starts one server per sweep (``bench.forkserver``: it imports torch, TorchDynamo and the
harness once) and asks it for one child per single-process trial; the child is the trial as a fresh process runs it
(docs/methodology.md, "Fork isolation"). ``ForkServer`` is the runner's side: it starts the server on first use,
restarts it when it died or when a trial's environment differs from the one it imported under, and stops it with
the sweep. ``Forked`` shows a forked child to the launcher as ``subprocess.Popen`` shows a process (``pid``,
``wait(timeout)``), so the launcher times, kills and records both kinds alike.

Which trials need a fresh interpreter (``fresh_reason``), and why:

- torchrun trials (several ranks): torchrun starts its ranks as processes of its own;
- trials of another checkout (``sweep --ab`` against another revision or directory): the server has imported this
  checkout's harness, and the trial must run the other's; an A/B run then starts both sides fresh, since only the
  code may differ between them (``--ab . --ab-isolation fresh`` compares the modes themselves);
- ``--isolation fresh``; trials of a batch job (``--executor slurm``: one trial per job, nothing to share); and
  every trial of a sweep whose server could not start or found its imports unsafe to fork (a warning says why).

A sweep with sets that compile has a second server, the compile server: it also runs what a trial's first
``torch.compile`` call imports (TorchInductor's front end: 0.8 s of every compiling trial's build, measured on the
2-core AMD EPYC), and only those sets' trials fork from it. A trial that never compiles does not carry those
modules, which a fresh process of it would not have imported either (``compiles``).

Users' models and techniques (``--model``, ``--technique``) fork: the child loads them after the fork, as a fresh
trial loads them after its imports, and a plugin that starts a thread pool or initialises CUDA does so in its own
trial's process only. Every record says which way its trial started (``isolation``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.core.files import REPO_DIR
from bench.plan.config import SweepConfig, TechniqueSet
from bench.plan.planner import Trial
from bench.run import sweepdir
from bench.trial import LAUNCHED_AT

log = logging.getLogger(__name__)

# Read by the trial after it starts, never at import (torch's cache_dir() reads TORCHINDUCTOR_CACHE_DIR at each
# call): they may differ between the server and its children. Any other difference restarts the server.
PER_TRIAL_ENV = ("TORCHINDUCTOR_CACHE_DIR", LAUNCHED_AT)
READY_TIMEOUT_S = 300.0  # the server's imports: about 2.5 s on an idle 2-core machine
STOP_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 60.0  # the server answers a fork request at once
SERVER = "bench.forkserver"
# bench.forkserver.COMPILE_FLAG, not imported: that module calls os.sysconf at import, which Windows lacks
COMPILE_FLAG = "--compile"


def fresh_reason(cfg: SweepConfig, code_dir: Path, trial: Trial | None = None) -> str | None:
    """Why a trial (any of the sweep's, when ``trial`` is None) runs in a fresh interpreter; None: it forks."""
    if cfg.isolation == "fresh":
        return "isolation fresh"
    if not sys.platform.startswith("linux"):
        return "the fork server needs Linux (prctl, /proc/self/pagemap)"
    if Path(code_dir).resolve() != REPO_DIR.resolve():
        return "another checkout's code (sweep --ab): the server imported this one's"
    if trial is not None and trial.world_size > 1:
        return "torchrun starts its ranks"
    return None


def compiles(techniques_: TechniqueSet) -> bool:
    """Whether a set calls ``torch.compile`` (its trials fork from the compile server)."""
    import techniques

    known = techniques.registry()
    return any(name in known and known[name].phase is techniques.Phase.COMPILE for name in techniques_.names)


class ServerLost(RuntimeError):
    """The fork server ended (killed, crashed) while the runner waited on it."""


class Forked:
    """A trial forked by the server, seen as ``subprocess.Popen`` sees a process. ``lost``: why its exit status is
    unknown (the server ended first; the child ended with it, by its parent-death signal)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.lost: str | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The child's return code (negative: the signal that ended it); ``subprocess.TimeoutExpired`` after
        ``timeout`` seconds. Blocks on the server's socket: no polling."""
        if self.returncode is None:
            self.returncode = self.server.wait(self, timeout)
        return self.returncode


class ForkServer:
    """The runner's side of the sweep's fork server (see the module's docstring)."""

    def __init__(self, code_dir: Path, compile_imports: bool = False) -> None:
        self.code_dir = Path(code_dir)
        self.compile_imports = compile_imports  # the compile server (``bench.forkserver._compile_imports``)
        self.broken: str | None = None  # why the server cannot be used: this sweep's trials then start fresh
        self.starts = 0  # servers started so far (restarts included)
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._env: dict[str, str] | None = None
        self._dir: Path | None = None
        self._buffer = b""
        self._ready = False
        self._exits: dict[int, int] = {}
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        """The running server's pid (None before it started or after it stopped)."""
        return self._proc.pid if self._proc is not None else None

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start the server (its imports go on in the background; ``spawn`` waits for them)."""
        if self._proc is not None or self.broken:
            return
        env = _base(env if env is not None else base_env())
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._dir = Path(tempfile.mkdtemp(prefix=sweepdir.temp_prefix()))  # removed with a runner that died
        with open(self._dir / "server.log", "wb") as out:
            # bench.guard: the server dies with the runner (and its children with it); a session of its own: the
            # terminal's Ctrl-C reaches the runner, which ends the trial and stops the server itself.
            cmd = [sys.executable, "-m", "bench.guard", str(os.getpid()), sys.executable, "-m", SERVER,
                   str(theirs.fileno()), *([COMPILE_FLAG] if self.compile_imports else [])]
            self._proc = subprocess.Popen(cmd, cwd=self.code_dir, env=env, stdout=out, stderr=out,
                                          pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self._sock, self._env, self._buffer, self._ready, self._exits = mine, env, b"", False, {}
        self.starts += 1
        log.info("fork server starting (pid %d)", self._proc.pid)

    @property
    def ready(self) -> bool:
        """Whether the running server has done its imports and forks on request."""
        return self._ready

    def wait_ready(self) -> None:
        """Wait until a started server has done its imports (a no-op before ``start`` or once ready)."""
        if self._proc is not None and not self._ready and not self.broken:
            self._handshake()

    def spawn(self, module: str, argv: list[str], env: dict[str, str], log_path: Path) -> Forked | None:
        """Fork ``python -m module argv`` with ``env``, its cwd the code's checkout and its stdout and stderr
        appended to ``log_path``; None when the server cannot (the caller starts the trial fresh)."""
        base = _base(env)
        if self._proc is not None and base != self._env:
            changed = sorted(k for k in base.keys() | self._env.keys() if base.get(k) != self._env.get(k))
            log.info("restarting the fork server: the trial's environment differs from the one it imported under "
                     "(%s)", ", ".join(changed[:5]))
            self.stop()
        for attempt in (1, 2):  # a server that died between trials is started again, once per trial
            if self.broken:
                return None
            if self._proc is not None and self._proc.poll() is not None:
                log.warning("the fork server (pid %d) ended between trials (%s); starting another", self._proc.pid,
                            _ended(self._proc.returncode))
                self.stop()
            self.start(env)
            try:
                if not self._ready:
                    self._handshake()
                    if self.broken:
                        return None
                return self._fork(module, argv, env, log_path)
            except ServerLost as exc:
                if attempt == 2:
                    self._fail(f"it ended twice in a row ({exc})")
                    return None
                log.warning("the fork server ended (%s); starting another", exc)
                self.stop()
        return None

    def wait(self, child: Forked, timeout: float | None) -> int:
        """The return code of ``child`` (see ``Forked.wait``); when the server ends first, the child is ended too
        and ``child.lost`` says why its code is not known (-SIGKILL is returned)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while child.pid not in self._exits:
                self._message(deadline)
        except ServerLost as exc:
            child.lost = f"the fork server ended while the trial ran ({exc}), and the trial with it"
            _end_orphan(child.pid)
            self.stop()
            return -signal.SIGKILL
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(f"{SERVER} child {child.pid}", timeout) from None
        return self._exits.pop(child.pid)

    def stop(self) -> None:
        """Stop the server (it ends its children, if any, by their parent-death signal) and remove its files."""
        proc, sock, self._proc, self._sock, self._ready = self._proc, self._sock, None, None, False
        if sock is not None:
            try:
                sock.sendall(b'{"stop": true}\n')
            except OSError:
                pass
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # ---- the socket ----

    def _handshake(self) -> None:
        try:
            message = self._message(time.monotonic() + READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._fail(f"its imports took longer than {READY_TIMEOUT_S:g} s")
            return
        except ServerLost as exc:
            self._fail(str(exc))
            return
        if not message.get("ready"):
            self._fail(message.get("error") or f"it said {message!r}")
            return
        self._ready = True
        log.info("fork server ready (pid %d): imports in %.2f s, %d MiB of file pages to map in each child",
                 self._proc.pid, message.get("preload_s", 0.0), message.get("resident_file_bytes", 0) >> 20)

    def _fork(self, module: str, argv: list[str], env: dict[str, str], log_path: Path) -> Forked | None:
        self._next_id += 1
        request = {"id": self._next_id, "module": module, "argv": argv, "env": env, "cwd": str(self.code_dir),
                   "log": str(log_path)}
        try:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
        except OSError as exc:
            raise ServerLost(f"sending to it failed: {exc}") from None
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        try:
            while True:
                message = self._message(deadline)
                if message.get("id") == request["id"]:
                    break
        except subprocess.TimeoutExpired:
            raise ServerLost(f"no answer to a fork request within {ANSWER_TIMEOUT_S:g} s") from None
        if "error" in message:  # fork() itself failed (EAGAIN, ENOMEM): this trial starts fresh
            log.warning("the fork server could not fork this trial (%s): it starts fresh", message["error"])
            return None
        return Forked(self, message["pid"])

    def _message(self, deadline: float | None) -> dict:
        """The server's next message (an exit status is filed away and returned too); ``ServerLost`` at its end."""
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(SERVER, 0)
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(1 << 16)
            except TimeoutError:
                raise subprocess.TimeoutExpired(SERVER, 0) from None
            except OSError as exc:
                raise ServerLost(str(exc)) from None
            if not data:
                try:
                    code = self._proc.wait(timeout=STOP_TIMEOUT_S) if self._proc is not None else None
                except subprocess.TimeoutExpired:
                    code = None
                raise ServerLost(_ended(code))
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if "exited" in message:
            self._exits[message["exited"]] = message["code"]
        return message

    def _fail(self, why: str) -> None:
        tail = ""
        if self._dir is not None and (self._dir / "server.log").is_file():
            lines = (self._dir / "server.log").read_text(errors="replace").strip().splitlines()[-3:]
            tail = f" (its log: {' | '.join(lines)})" if lines else ""
        self.broken = f"{why}{tail}"[:600]
        log.warning("the fork server cannot be used: %s; this sweep's trials start in fresh processes",
                    self.broken)
        self.stop()


def base_env() -> dict[str, str]:
    """What every trial process's environment starts from (the launcher adds the per-trial keys)."""
    return dict(os.environ, PYTHONUNBUFFERED="1")


def _base(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_TRIAL_ENV}


def _ended(code: int | None) -> str:
    if code is None:
        return "its exit status is unknown"
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _end_orphan(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """Make sure a child the server left behind is gone: its parent-death signal (SIGTERM) should have ended it;
    SIGKILL to its process group, then a blocking wait on its pidfd (it is not this process's child)."""
    try:
        os.killpg(pid, signal.SIGKILL)
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, PermissionError, OSError):
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


__all__ = ["PER_TRIAL_ENV", "ForkServer", "Forked", "ServerLost", "base_env", "fresh_reason"]
