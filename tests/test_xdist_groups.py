"""The groups ``pytest -n`` keeps in one worker (tests/xdist_groups.py) name files that exist, and route by id."""

from __future__ import annotations

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install 'trainbench[test]')")

from tests.conftest import REPO  # noqa: E402
from tests.xdist_groups import DIST_WORKER_FILES, PREFERENCE_METHODS, SHARED_FIXTURE, group_of  # noqa: E402


def test_every_grouped_file_exists():
    for name in (*SHARED_FIXTURE, *DIST_WORKER_FILES, "test_pref_workload", *(f"test_{m}" for m in PREFERENCE_METHODS)):
        assert (REPO / "tests" / f"{name}.py").is_file(), name


def test_a_group_is_a_file_or_the_preference_workload_and_any_other_test_is_its_own():
    assert group_of("tests/test_tp.py::test_check_reasons") == group_of("tests/test_tp.py::test_x[a]") == "tests/test_tp.py"
    assert group_of("tests/test_fedavg.py::test_x") == group_of("tests/test_local_sgd.py::test_y") == "dist_worker"
    assert group_of("tests/test_dpo.py::test_check_and_options") == "pref"
    assert group_of("tests/test_registry.py::test_technique_runs_two_steps[grpo]") == "pref"
    assert group_of("tests/test_registry.py::test_technique_runs_two_steps[bf16]").endswith("[bf16]")
    assert group_of("tests/test_cli.py::test_unknown_flag_exits_2") == "tests/test_cli.py::test_unknown_flag_exits_2"
