"""scripts/aa_rate.py's injected slowdown still applies to bench/loop.py (the script refuses to run otherwise)."""

import importlib.util

from tests.conftest import REPO


def test_the_slowed_copy_waits_a_share_of_each_step(tmp_path):
    spec = importlib.util.spec_from_file_location("aa_rate", REPO / "scripts" / "aa_rate.py")
    aa_rate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa_rate)
    copy = aa_rate.slowed_copy(tmp_path / "b", 0.05)
    text = (copy / "bench" / "loop.py").read_text()
    compile(text, "loop.py", "exec")
    step = text[text.index(aa_rate._STEP_DEF):text.index(aa_rate._STEP_END)]
    assert "_slowdown_t0 = " in step and "0.05 * (" in step and "while " in step
    assert (REPO / "bench" / "loop.py").read_text().count("_slowdown") == 0  # this checkout is untouched
    assert (copy / "bench" / "trial.py").is_file()  # `sweep --ab DIR` accepts the copy as a checkout
