"""Fork isolation (bench/forkserver.py, bench/run/isolation.py): a forked trial is the trial a fresh process runs.

Shown, not assumed: the server imports without starting a thread pool; a fixed allocation reads the same forked and
fresh; a trial that dies by SIGSEGV, exits without a record, runs out of memory, hangs or leaks a thread leaves the
server and the next trial unharmed; a server killed between trials or during one is replaced and no record is lost;
a small sweep learns the same, bit for bit, in both modes, and its memory figures agree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
import torch

from bench.core.files import REPO_DIR
from bench.plan.config import ConfigError, build_config
from bench.plan.planner import plan
from bench.run.ab import Checkout, side_configs
from bench.run.isolation import ForkServer, base_env, fresh_reason
from bench.run.runner import SweepRunner
from tests.conftest import TINY_BUDGET

CPU = torch.device("cpu")
MIB = 2**20
PLUGINS = REPO_DIR / "tests" / "fixtures" / "plugins" / "isolation.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server needs Linux")


@pytest.fixture(scope="module", autouse=True)
def restored_registries():
    """This module registers its plugins (the saboteur technique, the 200 MiB model) in the test process: forget them
    afterwards, so that tests reading the registries (every technique's name, tune's candidates) see only their own."""
    from bench.plan import plugins
    from bench.workloads import base as wbase
    from techniques import base as tbase

    saved = [(d, dict(d)) for d in (tbase._REGISTRY, wbase._REGISTRY, plugins._SOURCES)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)


def _cfg(techniques: str, **over):
    budget = {**TINY_BUDGET, "min_steps": 3, "memory": False, "parity_steps": 0, **over.pop("budget", {})}
    return build_config("smoke", {"workloads": "mlp", "techniques": techniques, "repeats": 1, "mode": "speed",
                                  "threads": 1, "isolation": "fork", "budget": budget, **over})


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# ---- the server ---------------------------------------------------------------------------------------------------


@pytest.fixture
def server():
    srv = ForkServer(REPO_DIR)
    yield srv
    srv.stop()


def _timeit(srv: ForkServer, statement: str, log: Path, env: dict | None = None):
    """``python -m timeit -n 1 STATEMENT`` forked by the server: a child that runs any code once."""
    return srv.spawn("timeit", ["-n", "1", "-r", "1", statement], env or base_env(), log)


def test_the_server_imports_once_without_a_thread_pool_and_forks_children(server, tmp_path):
    child = _timeit(server, "import os; print('child', os.getpid(), os.getppid(), os.getsid(0))", tmp_path / "log")
    assert child is not None, server.broken
    assert child.wait(60) == 0, (tmp_path / "log").read_text()
    words = (tmp_path / "log").read_text().split()
    assert words[:4] == ["child", str(child.pid), str(server.pid), str(child.pid)]  # its own session
    # Only numpy's BLAS pool beside the main thread (OpenBLAS shuts it down before each fork): no OpenMP pool.
    numpy_threads = subprocess.run([sys.executable, "-c", "import os, numpy; print(len(os.listdir('/proc/self/task')))"],
                                   capture_output=True, text=True, check=True).stdout
    assert _threads(server.pid) <= int(numpy_threads)
    assert not psutil.Process(server.pid).children()  # no worker pool either: the child was its only one
    assert server.starts == 1


def test_a_preload_that_starts_a_thread_pool_is_refused(tmp_path):
    (tmp_path / "pool_at_import.py").write_text("import torch\ntorch.ones(2**22).add_(1)  # a parallel op: the pool\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from bench import forkserver as f; "
            "f.PRELOAD = (*f.PRELOAD, 'pool_at_import'); print(f.preload())")
    # two OpenMP threads whatever this machine's (or a pinned test worker's) CPUs: one would start no pool
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO_DIR, capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "2"}).stdout
    assert "thread" in out and "do not survive a fork" in out


def test_a_fixed_allocation_reads_the_same_forked_and_fresh(server, tmp_path):
    """200 MiB allocated in a forked child and in a fresh interpreter (tests/rss_probe.py): RSS at rest, the peak
    around the allocation and their difference agree within 2 MiB, though the forked child shares the server's pages."""
    readings = {}
    for mode in ("fresh", "fork"):
        out = tmp_path / f"{mode}.json"
        if mode == "fork":
            child = server.spawn("tests.rss_probe", [str(out)], base_env(), tmp_path / "log")
            assert child is not None and child.wait(120) == 0, (tmp_path / "log").read_text()
        else:
            subprocess.run([sys.executable, "-m", "tests.rss_probe", str(out)], cwd=REPO_DIR, env=base_env(),
                           check=True, timeout=120)
        readings[mode] = json.loads(out.read_text())
    fork, fresh = readings["fork"], readings["fresh"]
    for key in ("at_rest", "peak"):
        assert abs(fork[key] - fresh[key]) < 2 * MIB, (key, fork[key] / MIB, fresh[key] / MIB)
    growth = {m: r["peak"] - r["at_rest"] for m, r in readings.items()}
    assert abs(growth["fork"] - growth["fresh"]) < 2 * MIB and growth["fork"] >= 200 * MIB, growth
    # What makes it so: the library pages the server touched are in the child's page table (Rss counts them), while
    # its anonymous memory is still shared with the server (Pss, which splits shared pages, reads lower).
    assert abs(fork["rollup"]["Shared_Clean"] - fresh["rollup"]["Shared_Clean"]) < 2 * MIB
    assert fork["rollup"]["Shared_Dirty"] > 50 * MIB and fork["rollup"]["Pss"] < fresh["rollup"]["Pss"]


def test_the_references_step_returns_only_once_every_started_server_is_ready(tmp_path, monkeypatch):
    """The servers import beside the parity references' process; the first trial's window must not meet a server
    still importing (the compile server's probes take seconds), so the references step waits for them."""
    from bench import reference as reference_mod

    monkeypatch.setattr(reference_mod, "ensure", lambda *args, **kwargs: None)  # no references to compute here
    runner = SweepRunner(_cfg("compile"), tmp_path / "sweep", CPU)
    launcher, trials = runner.launcher, plan(runner.cfg, CPU)
    try:
        launcher.start_server(trials)
        launcher.prepare_references(trials)
        assert launcher.server.ready and launcher.compile_server.ready
    finally:
        runner.close()


def test_the_compile_server_forks_children_that_imported_what_torch_compile_imports(server, tmp_path):
    """A set that compiles forks from a server that ran torch.compile's imports (no thread pool either) and asked
    TorchInductor's questions about the machine (its children find the answers cached); the plain server's children
    never carry them, as a fresh trial that never compiles does not."""
    probe = ("import sys; print('inductor', 'torch._inductor.compile_fx' in sys.modules); "
             "from torch._inductor import cpu_vec_isa; print('isa', cpu_vec_isa.valid_vec_isa_list.cache_info().currsize)")
    compile_server = ForkServer(REPO_DIR, compile_imports=True)
    try:
        for srv, name in ((server, "plain"), (compile_server, "compile")):
            child = _timeit(srv, probe, tmp_path / name)
            assert child is not None, srv.broken
            assert child.wait(120) == 0, (tmp_path / name).read_text()
        assert (tmp_path / "plain").read_text().split()[:4] == ["inductor", "False", "isa", "0"]
        assert (tmp_path / "compile").read_text().split()[:4] == ["inductor", "True", "isa", "1"]
    finally:
        compile_server.stop()


def test_only_the_sets_that_compile_fork_from_the_compile_server(tmp_path):
    from bench.plan.config import TechniqueSet
    from bench.run import isolation

    cfg = _cfg("bf16,compile,bf16+compile")
    runner = SweepRunner(cfg, tmp_path / "sweep", CPU)
    launcher = runner.launcher
    try:
        servers = {t.techniques.label: launcher.server_for(t) for t in plan(cfg, CPU)}
        assert servers["compile"] is servers["bf16+compile"] is runner.compile_server
        assert servers["baseline"] is servers["bf16"] is runner.fork_server
        assert runner.compile_server.compile_imports and not runner.fork_server.compile_imports
        assert isolation.compiles(TechniqueSet.parse("bf16+compile")) and not isolation.compiles(TechniqueSet(()))
        no_compile = SweepRunner(_cfg("bf16"), tmp_path / "other", CPU)
        assert no_compile.compile_server is None and no_compile.fork_server is not None
    finally:
        runner.close()


def test_a_hung_child_is_killed_and_the_server_forks_the_next(server, tmp_path):
    from bench.run.launcher import _kill_group

    hung = _timeit(server, "import time; time.sleep(3600)", tmp_path / "log")
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(timeout=1.0)
    _kill_group(hung)
    assert hung.returncode == -signal.SIGKILL
    after = _timeit(server, "pass", tmp_path / "log")
    assert after.wait(60) == 0 and server.starts == 1


def test_a_different_environment_restarts_the_server_and_reaches_the_child(server, tmp_path):
    first = _timeit(server, "pass", tmp_path / "log")
    assert first.wait(60) == 0
    env = {**base_env(), "TRAINBENCH_TEST_VALUE": "42", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    child = _timeit(server, "import os; print('value', os.environ['TRAINBENCH_TEST_VALUE'], "
                            "os.environ['TORCHINDUCTOR_CACHE_DIR'])", tmp_path / "log2", env)
    assert child.wait(60) == 0
    assert (tmp_path / "log2").read_text().split()[:3] == ["value", "42", str(tmp_path / "inductor")]
    assert server.starts == 2  # TRAINBENCH_TEST_VALUE restarted it; TORCHINDUCTOR_CACHE_DIR alone would not
    again = _timeit(server, "pass", tmp_path / "log3", {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "other")})
    assert again.wait(60) == 0 and server.starts == 2


# ---- trials -------------------------------------------------------------------------------------------------------


FAULTS = {  # the saboteur technique's kind -> the record's status and words of its reason
    "segv": ("failed", "killed by SIGSEGV"),
    "exit": ("failed", "exited with code 3"),
    "memory": ("oom", "MemoryError"),
    "rlimit": ("oom", "can't allocate memory"),
    "hang": ("timeout", "longer than timeout_s"),
    "thread": ("ok", None),
}


def test_faults_leave_the_server_and_the_next_trial_unharmed_and_a_killed_server_loses_no_record(tmp_path):
    """One sweep, one server: trials that die by SIGSEGV, exit without a record, run out of memory (a MemoryError; an
    address-space limit), hang past their timeout or leak a thread are recorded as such and the server forks the
    next trial unharmed. Then the server is killed between two trials: another starts and no record is lost."""
    sets = ",".join(f"saboteur:kind={k}" for k in FAULTS)
    cfg = _cfg(sets, technique_plugins=[f"{PLUGINS}:Saboteur"], budget={"timeout_s": 10.0, "max_train_seconds": 5.0})
    runner = SweepRunner(cfg, tmp_path / "sweep", CPU)
    total = len(plan(cfg, CPU))
    seen = []  # (server pid, its threads) after each trial

    def watch(progress):
        pid = runner.fork_server.pid
        seen.append((pid, _threads(pid)))
        if progress.done == total - 1:  # before the last trial: kill the server
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(10)

    records = {r.technique_label: r for r in runner.run(watch)}
    assert len(records) == len(FAULTS) + 1 == total and len(runner.store.read()) == total
    for kind, (status, words) in FAULTS.items():
        r = records[f"saboteur:kind={kind}"]
        assert r.status == status and (words is None or words in r.reason), (kind, r.status, r.reason)
    assert {r.isolation for r in records.values()} == {"fork"}
    base = records["baseline"]
    assert base.status == "ok" and base.build.threads == 1
    pids = [pid for pid, _ in seen]
    assert len(set(pids[:-1])) == 1 and pids[-1] != pids[0]  # one server until it was killed, then another
    assert runner.fork_server.starts == 2
    assert max(n for _, n in seen[:-1]) <= seen[0][1]  # the leaked thread stayed in its trial's process


def test_a_server_killed_during_a_trial_takes_only_that_trial_and_is_replaced(tmp_path):
    cfg = _cfg("saboteur:kind=hang", technique_plugins=[f"{PLUGINS}:Saboteur"], budget={"timeout_s": 120.0})
    runner = SweepRunner(cfg, tmp_path / "sweep", CPU)
    trials = plan(cfg, CPU)
    hang = next(i for i, t in enumerate(trials) if t.techniques.label != "baseline")
    stop = threading.Event()

    def killer():  # kills the server once the hanging trial's child is running
        while not stop.wait(0.2):
            srv = runner._server
            if srv is None or srv.pid is None:
                continue
            try:
                children = psutil.Process(srv.pid).children()
            except psutil.NoSuchProcess:
                continue
            if any(c.name() == "bench.trial" for c in children) and len(runner.store.read()) == hang:
                os.kill(srv.pid, signal.SIGKILL)
                return

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        records = {r.trial_id: r for r in runner.run()}
    finally:
        stop.set()
        thread.join()
    lost = records[trials[hang].trial_id]
    assert lost.status == "killed" and "fork server ended while the trial ran" in lost.reason, lost.reason
    (other,) = [r for t, r in records.items() if t != trials[hang].trial_id]
    assert other.status == "ok" and other.isolation == "fork"
    assert runner.fork_server.starts == (2 if hang == 0 else 1) and len(runner.store.read()) == len(trials)


# ---- which trials fork --------------------------------------------------------------------------------------------


def test_which_trials_start_fresh_and_why(tmp_path):
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline,ddp", "nproc": 2, "isolation": "fork"})
    one, two = (next(t for t in plan(cfg, CPU) if t.world_size == n) for n in (1, 2))
    assert fresh_reason(cfg, REPO_DIR, one) is None
    assert "torchrun" in fresh_reason(cfg, REPO_DIR, two)
    assert "another checkout" in fresh_reason(cfg, tmp_path, one)
    fresh = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "isolation": "fresh"})
    assert fresh_reason(fresh, REPO_DIR) == "isolation fresh"
    assert SweepRunner(fresh, tmp_path / "s", CPU).fork_server is None


def test_isolation_is_a_setting_of_the_sweep_but_not_of_its_measurements(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="isolation must be one of fork, fresh"):
        build_config("smoke", {"isolation": "spawn"})
    monkeypatch.setenv("TRAINBENCH_ISOLATION", "fresh")
    assert build_config("smoke").isolation == "fresh"  # the default the test suite can force
    assert build_config("smoke", {"isolation": "fork"}).isolation == "fork"  # a flag or config still wins
    fork, fresh = build_config("smoke", {"isolation": "fork"}), build_config("smoke", {"isolation": "fresh"})
    from bench.run.sweepdir import settings_hash

    assert settings_hash(fork) == settings_hash(fresh)  # a resume may switch; each record says which it used
    assert 'isolation = "fork"' in fork.to_toml()


def test_an_ab_run_starts_both_sides_alike_unless_told_to_compare_the_modes(tmp_path):
    cfg = build_config("smoke", {"isolation": "fork"})
    other = Checkout(tmp_path, "elsewhere", None)
    assert [c.isolation for c in side_configs(cfg, other, None)] == ["fresh", "fresh"]
    same = Checkout(REPO_DIR, ".", None)
    assert [c.isolation for c in side_configs(cfg, same, None)] == ["fork", "fork"]
    assert [c.isolation for c in side_configs(cfg, same, "fresh")] == ["fork", "fresh"]
    with pytest.raises(ConfigError, match="use it with --ab ."):
        side_configs(cfg, other, "fresh")


# ---- nothing measured moves -----------------------------------------------------------------------------------


def _isolation_check():
    spec = importlib.util.spec_from_file_location("isolation_check", REPO_DIR / "scripts" / "isolation_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def both_modes(tmp_path_factory):
    """One small sweep run twice, forked and fresh: the 200 MiB model (tests/fixtures/plugins/isolation.py), the
    same model without its buffer and cnn:tiny (whose window peak RSS once read 4-10% higher forked), baseline and
    gradient accumulation, quality and speed, memory passes on."""
    root = tmp_path_factory.mktemp("modes")
    dirs = {}
    for mode in ("fork", "fresh"):
        cfg = build_config("smoke", {
            "models": [f"big={PLUGINS}:build", f"small={PLUGINS}:build_small"], "workloads": "cnn:tiny",
            "techniques": "grad_accum:steps=2",
            "repeats": 1, "threads": 1, "isolation": mode, "budget": {**TINY_BUDGET, "min_steps": 3}})
        dirs[mode] = root / mode
        SweepRunner(cfg, dirs[mode], CPU).run()
    return dirs


@pytest.mark.slow
def test_a_small_sweep_learns_the_same_bit_for_bit_and_its_memory_reads_the_same(both_modes):
    lines = _isolation_check().check(both_modes["fork"], both_modes["fresh"], memory_rtol=0.02)
    assert not [line for line in lines if line.startswith("DIFFERS")], "\n".join(lines)
    assert "quality: identical bit for bit in 6 of 6 trials" in lines, "\n".join(lines)
    assert "isolation recorded: fork sweep ['fork'], fresh sweep ['fresh']" in lines


@pytest.mark.slow
def test_the_fixed_allocation_adds_the_same_to_every_memory_figure_in_both_modes(both_modes):
    """The 200 MiB buffer: the big model's RSS figures less the small model's, in each mode, within 3 MiB."""
    added = {}
    for mode, d in both_modes.items():
        rows = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines()]
        by = {(r["workload"]["name"], r["technique_label"]): r["memory"] for r in rows}
        for label in ("baseline", "grad_accum:steps=2"):
            big, small = by[("big", label)], by[("small", label)]
            added[(mode, label)] = (big["clean_rss"]["at_rest_bytes"] - small["clean_rss"]["at_rest_bytes"],
                                    big["clean_rss"]["peak_bytes"] - small["clean_rss"]["peak_bytes"])
    for label in ("baseline", "grad_accum:steps=2"):
        fork, fresh = added[("fork", label)], added[("fresh", label)]
        assert all(abs(a - b) < 3 * MIB for a, b in zip(fork, fresh, strict=True)), (label, fork, fresh)
        assert all(abs(a - 200 * MIB) < 8 * MIB for a in fork), fork
