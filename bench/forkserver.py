"""``python -m bench.forkserver FD``: the sweep's fork server, a process that imports once and forks each trial.

Every trial process used to import torch, the harness and TorchDynamo (which the first ``torch.optim`` optimizer
imports) before it measured anything: about 2.2 s a trial on a 2-core CPU, most of a small trial's wall time. This
process does those imports once, then forks one child per single-process trial. The child is the trial as a fresh
process runs it: ``python -m bench.trial SPEC RECORD`` (``runpy``, as ``-m`` does), in a session of its own, with
the trial's environment, working directory and stderr, ended with the server (so with the runner: the server is
started under ``bench.guard``), killed at its timeout by the runner, its exit status reported to the runner.

Why a server of our own rather than ``multiprocessing``'s forkserver with a preload list:

- the child must start as ``python -m bench.trial`` does and nothing else; a ``multiprocessing`` child re-imports
  the parent's ``__main__`` (pytest, a user's script, ``bench.__main__`` with pandas and the report behind it: memory
  a fresh trial never holds), runs its own bootstrap and reports through its own objects;
- its preload ignores import errors silently, and its server is a global of the runner's process, shared with a
  user's own use of ``multiprocessing`` and started with whatever environment the runner had at the time;
- the checks below (no thread pool, no CUDA) and the resident-page list need code in the server anyway.

What the server does, and nothing else: it imports numpy (torch imports it too; OpenBLAS starts its thread pool
here, and shuts it down itself before every fork, ``pthread_atfork``), torch, the trial module's own imports (read
from its source: the module itself runs in the child, as ``__main__``, exactly once) and ``torch._dynamo``; then it
checks that no other thread was started (a tensor op at import time starts torch's OpenMP pool: libgomp's threads
do not survive a fork, and GCC's libgomp does not support forking after them), that CUDA was not initialised, and
lists the file-backed pages it holds. No tensor op, no thread pool, no CUDA. A request with another module (tests)
runs that module the same way. Started with ``--compile`` it is the compile server: it also does the imports of a
first ``torch.compile`` call (``_compile_imports``), for the trials of sets that compile.

The pages: a forked child shares its parent's memory, but the kernel copies the page tables of anonymous memory
only; the pages of libraries and other files the parent had mapped (about 100 MiB of torch's libraries after the
imports) are not in the child's page tables until it touches them, so its RSS reads lower than a fresh process's
by whatever it has not touched yet (measured on a 2-core CPU: 97 MiB right after the fork, 54-58 MiB at the end of
a small trial).
The child maps exactly the pages the server had resident (``MADV_POPULATE_READ``: no copy, no I/O: they are in the
page cache) before the trial starts, so RSS, its peak and the clean pass mean what they mean in a fresh process:
the same pages are counted (docs/methodology.md, "Fork isolation"). Anonymous memory needs nothing: it is counted
by both (shared with the server until written, which RSS does not tell apart from private).

Protocol: JSON lines over the socket ``FD``. The server sends ``{"ready": ...}`` (or ``{"error": ...}`` and exits);
the runner sends ``{"id", "module", "argv", "env", "cwd", "log"}`` and gets ``{"id", "pid"}`` (or ``{"id",
"error"}``) at once and ``{"exited": pid, "code": returncode}`` when the child ends (a negative code: the signal,
as ``subprocess`` says it); ``{"stop": true}`` or the socket's end stops the server. Linux only (``prctl``,
``/proc/self/pagemap``); the runner uses fresh processes elsewhere.
"""

from __future__ import annotations

import array
import ast
import atexit
import ctypes
import importlib
import importlib.util
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback

PRELOAD = ("numpy", "torch", "bench.trial", "torch._dynamo")  # bench.trial: its imports only (see _import_of)
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
MADV_POPULATE_READ = 22  # Linux 5.14
PAGE = os.sysconf("SC_PAGE_SIZE")
COMPILE_FLAG = "--compile"  # the compile server: it also runs _compile_imports
CHILD_NAME = b"bench.trial"  # the forked child's name (ps -o comm, top, psutil's name()): its cmdline is the server's


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _import_of(module: str) -> None:
    """Run the module's own top-level imports, not its body: what ``python -m module`` imports before its first
    line of its own, without a second copy of the module beside the ``__main__`` the child runs."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module named {module!r}")
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), spec.origin)
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
               and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    exec(compile(ast.Module(body=imports, type_ignores=[]), spec.origin, "exec"), {"__name__": f"_preload_{module}"})


def preload(compile_imports: bool = False) -> list[str]:
    """Import what every trial imports (``compile_imports``: and what a compiling trial's ``torch.compile`` call
    imports); the problems that make forking unsafe (none: fork away)."""
    importlib.import_module(PRELOAD[0])
    baseline = _threads()  # numpy's OpenBLAS pool, which OpenBLAS itself shuts down before a fork
    for name in PRELOAD[1:]:
        if name == "bench.trial":
            _import_of(name)
        else:
            importlib.import_module(name)
    if compile_imports:
        _compile_imports()
    problems = []
    if _threads() != baseline:
        problems.append(f"the imports started {_threads() - baseline} thread(s) (a thread pool: a tensor op at import "
                        "time?), and threads do not survive a fork")
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        problems.append("the imports initialised CUDA, which a forked child cannot use")
    with open("/proc/self/maps") as fh:
        if any("libcuda.so" in line for line in fh):
            problems.append("the imports loaded the CUDA driver (libcuda), which does not survive a fork")
    return problems


def _compile_imports() -> None:
    """What every trial of a set with ``compile`` imports when it first calls ``torch.compile`` (TorchInductor's
    front end, its configuration and their dependencies; measured on the 2-core AMD EPYC: 594 modules, 0.8 s of each
    such trial's build): done once here, by compiling a module that is never called. Nothing is traced or compiled
    until a call, so no tensor op runs and no thread starts (checked below). Only the compile server does it: a trial
    that never compiles must not carry these modules, or its RSS would read higher forked than fresh. Then what
    TorchInductor asks of the machine once per process (``_inductor_machine_facts``)."""
    torch = sys.modules["torch"]
    torch.compile(torch.nn.Identity())
    _inductor_machine_facts()


def _inductor_machine_facts() -> None:
    """Before its first CPU kernel, TorchInductor finds which vector instruction sets this CPU builds and loads: it
    compiles a probe for each candidate and loads it in a subprocess of its own (6 of them, about 1 s of every
    compiling trial on the 2-core AMD EPYC, half of a warm compile's one-off cost). It also hashes torch's sources
    for its cache keys (about 0.15 s). Both answers are the machine's and the installation's, the same in every
    trial, and kept in the process (``functools.cache``): asked here once, a forked child inherits them. No tensor op
    runs and the subprocesses are gone before the server forks. The probes compile into TorchInductor's default
    cache directory (the server's environment holds no ``TORCHINDUCTOR_CACHE_DIR``: that is each trial's), so they
    compile once per machine; a failure leaves the question to each trial, as in a fresh process."""
    from torch._inductor import codecache, cpu_vec_isa

    try:
        cpu_vec_isa.valid_vec_isa_list()
        codecache.torch_key()
    except Exception:  # noqa: BLE001 - the trials ask again
        pass


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, length) of each run of pages of this process's readable file mappings that are in its page table
    (``/proc/self/pagemap``'s present bit: readable for one's own process without privileges)."""
    runs: list[tuple[int, int]] = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not fields[5].startswith("/") or fields[1][0] != "r":
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(lo // PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(pagemap.read((hi - lo) // PAGE * 8))
            start = None
            for i, entry in enumerate(entries):
                if entry >> 63:
                    start = i if start is None else start
                elif start is not None:
                    runs.append((lo + start * PAGE, (i - start) * PAGE))
                    start = None
            if start is not None:
                runs.append((lo + start * PAGE, (len(entries) - start) * PAGE))
    return runs


def map_pages(runs: list[tuple[int, int]]) -> int:
    """Put ``runs`` into this process's page table (read faults without the reads where the kernel can); the runs
    that failed (a mapping the server had and this process lost: none expected)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = 0
    for address, length in runs:
        if libc.madvise(address, length, MADV_POPULATE_READ) == 0:
            continue
        if ctypes.get_errno() != 22:  # EINVAL: a kernel before 5.14; anything else: not mappable any more
            failed += 1
            continue
        for page in range(address, address + length, PAGE):  # the old way: read one byte of each page
            ctypes.string_at(page, 1)
    return failed


# ---- the child ----------------------------------------------------------------------------------------------------


def _child(request: dict, server_pid: int, close: list[int], runs: list[tuple[int, int]]) -> None:
    """The forked trial: what ``subprocess.Popen(start_new_session=True)`` and ``bench.guard`` give a fresh trial,
    then ``python -m MODULE ARGV``. Never returns: the server's loop must not run on in a child."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != server_pid:  # the server died before the request took effect
            os._exit(1)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(CHILD_NAME), 0, 0, 0)
        for fd in close:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()  # the trial's environment, before anything reads it (putenv: C code sees it too)
        os.environ.update(request["env"])
        map_pages(runs)
        if "numpy" in sys.modules:  # numpy's global generator is seeded from the OS at import: reseed, as a fresh
            sys.modules["numpy"].random.seed()  # process would be (Python's random reseeds itself at fork)
        sys.argv = [request["module"], *request["argv"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # as the interpreter ends on one: None is 0, a number is the code, else printed and 1
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # the interpreter would print it and exit 1
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# ---- the server ---------------------------------------------------------------------------------------------------


class Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.selector = selectors.DefaultSelector()
        self.runs: list[tuple[int, int]] = []

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
        signal.set_wakeup_fd(self.wake_w)
        self.selector.register(self.sock, selectors.EVENT_READ, "request")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "child")
        while True:
            for key, _ in self.selector.select():
                if key.data == "child":
                    os.read(self.wake_r, 4096)
                    self.reap()
                elif not self.requests():
                    return

    def requests(self) -> bool:
        """Handle the whole requests received; False when the runner is gone or asked the server to stop."""
        data = self.sock.recv(1 << 20)
        if not data:
            return False
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            request = json.loads(line)
            if request.get("stop"):
                return False
            self.fork(request)
        return True

    def fork(self, request: dict) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        server_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN, ENOMEM: the runner runs this trial fresh
            self.send({"id": request["id"], "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            _child(request, server_pid, [self.sock.fileno(), self.wake_r, self.wake_w, self.selector.fileno()],
                   self.runs)
        self.send({"id": request["id"], "pid": pid})

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not argv[0].isdigit() or argv[1:] not in ([], [COMPILE_FLAG]):
        print(f"usage: python -m bench.forkserver FD [{COMPILE_FLAG}] (FD: a connected Unix socket)", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    started = time.perf_counter()
    try:
        problems = preload(compile_imports=COMPILE_FLAG in argv)
        server = Server(sock)
        server.runs = resident_file_pages()
    except BaseException as exc:  # the runner says why and runs its trials fresh
        sock.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}).encode() + b"\n")
        return 1
    if problems:
        server.send({"error": "; ".join(problems)})
        return 1
    server.send({"ready": True, "pid": os.getpid(), "preload_s": round(time.perf_counter() - started, 3),
                 "resident_file_bytes": sum(n for _, n in server.runs)})
    try:
        server.serve()
    except (BrokenPipeError, ConnectionResetError):  # the runner is gone; the children die with this process
        pass
    os._exit(0)  # without tearing torch down: nothing of the server's is worth the runner's wait


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
