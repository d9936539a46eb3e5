"""``summary.md``: text from records is escaped as the report escapes it (the summary's numbers are tested with the
report's fixture in test_report.py)."""

from __future__ import annotations

import re

from bench.report import summary
from tests.records import record

REASON = "PicklingError: Can't pickle <function <lambda> at 0x7f>: attribute lookup *failed*"


def test_reasons_and_names_from_records_stay_text():
    records = [record("baseline", seed=s) for s in range(3)]
    records += [record("grad_accum:steps=4", seed=0, status="failed", reason=REASON),
                record("a|b", seed=0, status="skipped", reason="needs `torch.compile`")]
    text = summary.to_markdown(summary.summarize(records), title="Sweep '<x>' summary")
    assert "<lambda>" not in text and "<function" not in text and "<x>" not in text  # HTML would swallow them
    assert "failed: PicklingError: Can't pickle &lt;function &lt;lambda> at 0x7f>: attribute lookup \\*failed\\*" in text
    assert "skipped: needs \\`torch.compile\\`" in text
    assert text.startswith("# Sweep '&lt;x>' summary\n")
    row = next(line for line in text.splitlines() if line.startswith("| mlp:tiny | a\\|b |"))
    assert len(re.findall(r"(?<!\\)\|", row)) == len(summary.COLUMNS) + 1  # the name's '|' does not add a cell
