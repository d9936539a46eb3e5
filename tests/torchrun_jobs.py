"""A test file's two-rank jobs in one torchrun launch: ``launch`` on the test side, ``main`` under torchrun.

A launch costs about 4 s of CPU before any job runs (torchrun's own interpreter, two ranks importing torch, a gloo
rendezvous), several times what a job of a few tiny steps costs. So a test file declares its jobs and a module
fixture runs them all in one launch, one after the other in one process group; each test then reads its own job's
files. The ranks run the same jobs in the same order, with a barrier after each.

    torchrun --standalone --nproc-per-node 2 tests/torchrun_jobs.py JOBS_JSON

JOBS_JSON holds ``[{"name", "worker", "args", "env"}, ...]``: each job calls ``run(args)`` of the module ``worker``
(``tests.dist_worker``, ``tests.tp_worker``, ``tests.pp_worker``: the same arguments as their own command line)
with ``env`` set for that job only. A job that fails ends the launch, its name and traceback on stderr.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
OUT = "{out}"  # in a job's args: the job's own output directory
# The test files whose JOBS run tests/dist_worker.py: all in one launch (tests/conftest.py's dist_runs) and, under
# pytest -n, in one worker (tests/xdist_groups.py).
DIST_WORKER_FILES = ("test_distributed", "test_local_sgd", "test_fedavg")


@dataclass(frozen=True)
class Job:
    worker: str  # a module in tests/ with run(args): dist_worker, tp_worker or pp_worker
    args: tuple[str, ...]  # its command-line arguments, OUT standing for the job's directory
    env: dict[str, str] = field(default_factory=dict)  # set while this job runs, on both ranks


def launch(jobs: dict[str, Job], root: Path, timeout: float = 300) -> dict[str, Path]:
    """Run ``jobs`` in one launch of 2 gloo ranks; each job's output directory, ``root/NAME``, by name."""
    outs = {name: root / name for name in jobs}
    spec = []
    for name, job in jobs.items():
        outs[name].mkdir(parents=True, exist_ok=True)
        spec.append({"name": name, "worker": f"tests.{job.worker}", "env": job.env,
                     "args": [a.replace(OUT, str(outs[name])) for a in job.args]})
    (root / "jobs.json").write_text(json.dumps(spec, indent=1))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "tests" / "torchrun_jobs.py"), str(root / "jobs.json")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return outs


def main() -> None:
    import torch.distributed as dist

    from bench.trial import end_rank

    jobs = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo")
    for job in jobs:
        print(f"rank {dist.get_rank()}: job {job['name']}", file=sys.stderr, flush=True)
        with mock.patch.dict(os.environ, job["env"]):  # this job's variables, then the environment as it was
            importlib.import_module(job["worker"]).run(job["args"])
        dist.barrier()
    end_rank(0)  # the trial's own ending: barrier, destroy, exit before gloo's threads meet interpreter teardown


if __name__ == "__main__":
    main()
