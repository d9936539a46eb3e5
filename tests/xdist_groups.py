"""``pytest -n``: which tests one pytest-xdist worker runs together, so that an expensive build is made once.

Under xdist's default (``--dist load``) each test goes to whichever worker is free, and a module fixture is built
again in every worker that runs one of its module's tests. The tests below share a build that takes seconds: a
file's torchrun launch (tests/torchrun_jobs.py), a finished sweep, the rendered docs tables or report, or the
``pref`` workload's trained starting policy and reward model (kept in the process's memo, so every test of a
preference method and the registry-wide tests of those methods share them). This scheduler keeps each such group in
one worker and hands out every other test on its own, as ``--dist load`` does; the largest groups go first.

xdist's own ``--dist loadgroup`` would read ``xdist_group`` marks, but it passes them on by rewriting node ids,
which pytest 9.2 ignores: the marks are dropped without a word (pytest-xdist issue 1386). So the groups are named
here, by file, and reach xdist through its ``pytest_xdist_make_scheduler`` hook.
"""

from __future__ import annotations

import re

from xdist.scheduler import LoadScopeScheduling

from tests.torchrun_jobs import DIST_WORKER_FILES  # one torchrun launch for these files: one group

# A test file whose tests share a module fixture of several seconds: its tests form one group.
SHARED_FIXTURE = (
    "test_tp", "test_pp",  # one torchrun launch each
    "test_measure",  # the two-rank barrier windows, spawned once
    "test_runner",  # a finished sweep
    "test_docs_tables",  # every docs table rendered from the committed reports
    "test_report", "test_report_html",  # the rendered report; Chromium
)
PREFERENCE_METHODS = ("best_of_n", "dpo", "grpo", "rloo")  # their files and test_pref_workload build ``pref``


def group_of(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: a group's name, or the test's own id."""
    path, _, rest = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1].removesuffix(".py")
    if name in DIST_WORKER_FILES:
        return "dist_worker"
    if name in SHARED_FIXTURE:
        return path
    if name == "test_pref_workload" or name.removeprefix("test_") in PREFERENCE_METHODS:
        return "pref"
    param = re.search(r"\[([^\]]*)\]$", rest)
    if name == "test_registry" and param and param.group(1) in PREFERENCE_METHODS:
        return "pref"
    return nodeid


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with ``group_of`` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


class Plugin:
    """Registered by tests/conftest.py where xdist is installed."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        return GroupScheduling(config, log) if config.getvalue("dist") == "load" else None
