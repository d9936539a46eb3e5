"""The docs tables that quote measured numbers are generated from the committed reports (bench.dev.docs_tables)."""

import re
import shutil

import pytest

from bench.analyze import stats
from bench.dev import docs_tables

# A ratio ("0.53x [0.41, 0.69]") or a difference ("+0.0133 [-0.0322, +0.0589]") with its interval.
COMPARISON = re.compile(r"(?:\d+\.\d+x|[+-]\d+\.\d+) \[[^\]]+\]")
WORDS = ("faster", "slower", "less", "more", "better", "worse", "sooner", "later", stats.EQUIVALENT,
         stats.INCONCLUSIVE, f"({stats.NONE}")


@pytest.fixture(scope="module")
def bodies():
    return docs_tables.render()


def test_the_docs_tables_are_generated_from_the_committed_reports(bodies):
    found, _ = docs_tables.problems(bodies)
    assert found == [], "\n".join(found) + "\nrun: python -m bench.dev.docs_tables"


def test_every_quoted_comparison_carries_its_verdict_word(bodies):
    seen = 0
    for name, body in bodies.items():
        for m in COMPARISON.finditer(body):
            seen += 1
            after = body[m.end():].lstrip()
            assert after.startswith(WORDS), f"{name}: {m.group(0)} is followed by {after[:30]!r}, not a verdict"
    assert seen > 100  # the tables do quote intervals


def test_a_stale_missing_or_misnamed_block_is_caught_and_a_stale_one_rewritten(bodies, tmp_path):
    for doc in {spec.doc for spec in docs_tables.ALL.values()}:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(docs_tables.ROOT / doc, tmp_path / doc)
    page = tmp_path / "docs" / "model-techniques.md"
    text = page.read_text()
    page.write_text(text.replace("freeze:blocks=1 | 1,220 (1.47x [1.21, 1.79] faster)",
                                 "freeze:blocks=1 | 1,220 (1.47x faster)"))
    found, rewritten = docs_tables.problems(bodies, tmp_path)
    assert found == ["docs/model-techniques.md is out of date (blocks model-techniques-gpt): run python -m "
                     "bench.dev.docs_tables"]
    assert rewritten["docs/model-techniques.md"] == text

    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("generated: readme-example-cpu-auto", "generated: readme-exmaple-cpu-auto"))
    found, _ = docs_tables.problems(bodies, tmp_path)
    assert any("README.md has no block 'readme-example-cpu-auto'" in line for line in found)
    assert any("no table is called 'readme-exmaple-cpu-auto'" in line for line in found)


def test_update_rewrites_only_the_block_body():
    text = "prose\n<!-- generated: t (note) -->\nold\n<!-- end generated -->\nmore prose\n"
    new, unknown = docs_tables.update(text, {"t": "| new |\n"})
    assert new == "prose\n<!-- generated: t (note) -->\n| new |\n<!-- end generated -->\nmore prose\n"
    assert unknown == []


def test_the_machines_table_reads_the_examples_the_docs_name_and_never_a_users_sweep(tmp_path):
    env = (docs_tables.ROOT / "reports" / "example-cpu" / "env.json").read_text()
    for name in ("example-a", "quick-20261206-120000"):  # the second: a user's sweep left under reports/
        (tmp_path / "reports" / name).mkdir(parents=True)
        (tmp_path / "reports" / name / "env.json").write_text(env)
        (tmp_path / "reports" / name / "results.jsonl").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("See [the example](reports/example-a/report.md).\n")
    assert docs_tables.named_examples(tmp_path) == [tmp_path / "reports" / "example-a"]
    rows = docs_tables.machines(root=tmp_path)
    assert len(rows) == 3 and "example-a" in rows[2] and not any("quick-" in r for r in rows)
