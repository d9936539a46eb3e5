"""The layout's promises, checked statically (docs/architecture.md draws them):

- every module of bench/ has a layer, named by its folder, and imports only the layers below it (report/ sits beside
  run/ and reads records and analyses, never plan, trial or run);
- no import cycle among bench/ and techniques/, ``if TYPE_CHECKING:`` imports included (a type-only arrow is still
  an arrow the wrong way);
- the harness's reading side never names a technique (each technique carries its own reading: techniques/base.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import techniques

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "techniques")


# ---- import cycles ------------------------------------------------------------------------------------------


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its own name, for its __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The project modules ``name`` imports, at module level, inside functions (an import run later still closes a
    cycle) or under ``if TYPE_CHECKING:`` (an arrow the type checker follows is an arrow of the design), with the
    line of the first. Importing ``a.b.c`` also runs the packages ``a`` and ``a.b`` (their __init__), except the
    importer's own ancestors, which are always initialised before it."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            dotted = ".".join(parts[:i])
            if dotted in known and dotted != name and not (name + ".").startswith(dotted + "."):
                found.setdefault(dotted, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join([*here, base] if base else here)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
    return found


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """One cycle per strongly connected component of the import graph (its shortest loop through the component's
    first module), each module with the line of its import of the next."""
    known = _modules(root)
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        members, start = set(component), min(component)
        paths, frontier, loop = {start: [start]}, [start], None
        while frontier and loop is None:  # breadth first: the shortest way back to the start inside the component
            nxt = []
            for v in frontier:
                if start in graph[v]:
                    loop = [*paths[v], start]
                    break
                for w in graph[v]:
                    if w in members and w not in paths:
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
            frontier = nxt
        assert loop is not None
        cycles.append([f"{a} (line {graph[a][b]})" for a, b in zip(loop, loop[1:], strict=False)] + [loop[-1]])
    return cycles


def test_no_import_cycle_among_the_harness_and_the_techniques():
    cycles = import_cycles()
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _plant(root: Path, files: dict[str, str]) -> None:
    for file, text in files.items():
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text(text)


def test_the_cycle_finder_follows_function_level_and_type_checking_imports(tmp_path):
    _plant(tmp_path, {"bench/__init__.py": "", "bench/a.py": "import bench.b\n",
                      "bench/b.py": "def f():\n    from bench import a\n",
                      "techniques/__init__.py": "", "techniques/x.py": "from typing import TYPE_CHECKING\n\n"
                      "if TYPE_CHECKING:\n    from techniques import y\n", "techniques/y.py": "import techniques.x\n"})
    assert import_cycles(tmp_path) == [["bench.a (line 1)", "bench.b (line 2)", "bench.a"],
                                       ["techniques.x (line 4)", "techniques.y (line 1)", "techniques.x"]]


# ---- layers -------------------------------------------------------------------------------------------------

# Each layer may import the layers before it in this order, and nothing above it. The trial layer is the five
# modules the child process, the fork server and `sweep --ab` launch by name, so they stay at bench/'s top; the entry
# points parse and dispatch. report/ is not in the order: it may import only what REPORT_MAY_USE names, and only run/
# (whose workflow writes the summary and the report) and the entry points import it. dev/ (the docs check, the docs
# tables, the schema doc, gpu_check's plan and time split) sits above everything: it may import any layer, and no
# layer imports it.
TRIAL = ("bench.trial", "bench.loop", "bench.reference", "bench.guard", "bench.forkserver")
ENTRY = ("bench", "bench.__main__", "bench.api", "bench.cli")
ORDER = ("bench.core", "bench.measure", "bench.workloads", "techniques", "bench.records", "bench.analyze",
         "bench.plan", "trial", "bench.run", "entry", "bench.dev")
REPORT = "bench.report"
REPORT_MAY_USE = ("bench.analyze", "bench.records", "techniques", "bench.measure", "bench.core")
REPORT_USED_BY = ("bench.run", "entry", "bench.dev")


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    """The layer a module belongs to: its folder under bench/ (or techniques/), the trial layer or the entry
    points by name; None for a module that has no place."""
    if module in TRIAL:
        return "trial"
    if module in ENTRY or _under(module, "bench.cli"):
        return "entry"
    return next((layer for layer in (*ORDER, REPORT) if _under(module, layer)), None)


def may_import(layer: str, target: str) -> bool:
    if layer == REPORT:
        return target in REPORT_MAY_USE or target == REPORT
    if target == REPORT:
        return layer in REPORT_USED_BY
    return ORDER.index(target) <= ORDER.index(layer)


def wrong_way_imports(root: Path = ROOT) -> list[str]:
    """``module imports target (line N): layer may not import layer`` for each import against the layer rule, and
    ``module: no layer`` for a module outside every layer."""
    known = _modules(root)
    out = []
    for module, path in sorted(known.items()):
        layer = layer_of(module)
        if layer is None:
            out.append(f"{module}: no layer (put it in one of bench/'s layer folders: docs/architecture.md)")
            continue
        for target, line in sorted(_imports(module, path, known).items()):
            to = layer_of(target)
            if to is not None and target != "bench" and not may_import(layer, to):
                out.append(f"{module} imports {target} (line {line}): {layer} may not import {to}")
    return out


def test_every_module_imports_only_the_layers_below_its_own():
    wrong = wrong_way_imports()
    assert wrong == [], "\n".join(wrong)


def test_techniques_reach_workloads_through_their_interfaces_only():
    """A technique asks the model's description, the ``Preference`` interface and the registry (bench.workloads.base),
    never a workload's module: a new workload serves every technique without any technique knowing it."""
    known = _modules(ROOT)
    found = [f"{module} imports {target} (line {line})" for module, path in sorted(known.items())
             if _under(module, "techniques") for target, line in sorted(_imports(module, path, known).items())
             if _under(target, "bench.workloads") and target not in ("bench.workloads", "bench.workloads.base")]
    assert found == [], "\n".join(found)


def test_the_layer_check_rejects_a_planted_wrong_way_import_and_a_module_without_a_layer(tmp_path):
    _plant(tmp_path, {"bench/__init__.py": "", "bench/core/__init__.py": "", "bench/run/__init__.py": "",
                      "bench/report/__init__.py": "", "techniques/__init__.py": "",
                      "bench/core/text.py": "from bench.run import runner\n",  # the floor reaching up
                      "bench/run/runner.py": "from bench.core import text\n",  # fine: down
                      "bench/report/content.py": "def f():\n    from bench.run import runner\n",  # beside, not below
                      "bench/stray.py": "x = 1\n"})
    assert wrong_way_imports(tmp_path) == [
        "bench.core.text imports bench.run (line 1): bench.core may not import bench.run",
        "bench.core.text imports bench.run.runner (line 1): bench.core may not import bench.run",
        "bench.report.content imports bench.run (line 2): bench.report may not import bench.run",
        "bench.report.content imports bench.run.runner (line 2): bench.report may not import bench.run",
        "bench.stray: no layer (put it in one of bench/'s layer folders: docs/architecture.md)"]


def test_no_library_module_imports_the_developer_tools_and_only_run_and_the_entry_points_import_the_report(tmp_path):
    _plant(tmp_path, {"bench/__init__.py": "", "bench/dev/__init__.py": "", "bench/dev/docs_tables.py": "x = 1\n",
                      "bench/run/__init__.py": "", "bench/analyze/__init__.py": "", "bench/report/__init__.py": "",
                      "bench/cli/__init__.py": "from bench.report import summary\n",  # fine: an entry point
                      "bench/report/summary.py": "x = 1\n",
                      "bench/run/workflow.py": "from bench.report import summary\n",  # fine: the workflow writes it
                      "bench/run/tool.py": "from bench.dev import docs_tables\n",
                      "bench/analyze/words.py": "from bench.report import summary\n"})
    assert wrong_way_imports(tmp_path) == [
        "bench.analyze.words imports bench.report (line 1): bench.analyze may not import bench.report",
        "bench.analyze.words imports bench.report.summary (line 1): bench.analyze may not import bench.report",
        "bench.run.tool imports bench.dev (line 1): bench.run may not import bench.dev",
        "bench.run.tool imports bench.dev.docs_tables (line 1): bench.run may not import bench.dev"]


@pytest.mark.parametrize("module", ["bench.core.errors", "bench.measure.env", "bench.records.results",
                                    "bench.analyze.stats", "bench.plan.config", "bench.trial", "bench.run.runner",
                                    "bench.report.cells", "bench.cli", "techniques.bf16"])
def test_each_layer_is_its_folder(module):
    assert layer_of(module) is not None and module.replace(".", "/") in {
        str(p.relative_to(ROOT).with_suffix("")).replace("/__init__", "") for p in ROOT.glob(f"{module.split('.')[0]}/**/*.py")}


# ---- technique names under bench/ ---------------------------------------------------------------------------

# Where a string under bench/ may spell a technique's name, and why. Everything else (the report, the findings,
# the bottleneck diagnosis, "What to try next", the docs tables) reads what the techniques declare.
_PRESET = "the presets' technique sets: the default sweeps a user runs are configuration, as a TOML file is"
_DTYPE = "a dtype's short name (torch calls it so; the technique is named after it), for peaks and aliases"
ALLOWED: dict[tuple[str, str], str] = {
    ("bench.plan.config", "bf16"): _PRESET + "; and the example of a technique list in a TOML error message",
    ("bench.plan.config", "fp16"): _PRESET,
    ("bench.plan.config", "grad_accum"): _PRESET,
    ("bench.plan.config", "checkpointing"): _PRESET,
    ("bench.plan.config", "compile"): _PRESET,
    ("bench.plan.config", "tf32"): _PRESET,
    ("bench.plan.config", "fused_adamw"): _PRESET,
    ("bench.plan.config", "fp8"): _PRESET,
    ("bench.plan.config", "sparse24"): _PRESET,
    ("bench.plan.config", "sdpa_backend"): _PRESET,
    ("bench.plan.gpu", "bf16"): "the set whose step time `bench list` gives each GPU size beside fp32's: the "
                                "precision a GPU trains in",
    ("bench.measure.env", "bf16"): _DTYPE,
    ("bench.measure.env", "fp16"): _DTYPE,
    ("bench.measure.env", "tf32"): _DTYPE + "; and whether TF32 matmuls were on during a calibration",
    ("bench.plan.planner", "deepspeed"): "the optional Python package of that name, whose presence the planner checks",
    ("bench.run.ab", "prune"): "git worktree prune",
}
# Names that mean something else in the harness wherever they appear.
SAME_WORD = {
    "baseline": "the reference set's label: the empty set every sweep measures the others against",
    "batch_size": "the samples per optimizer step: a record field, a workload parameter and a TrainConfig field, "
                  "which the batch_size technique is named after",
}


def _documentation(tree: ast.AST) -> set[int]:
    """The strings that document rather than act: docstrings, a command-line option's ``help=`` and a record
    field's ``doc(...)`` text (their examples may spell technique sets, as docs/commands.md does)."""
    out = set()

    def strings(node: ast.AST) -> None:
        out.update(id(n) for n in ast.walk(node) if isinstance(n, ast.Constant))

    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "help":
                    strings(kw.value)
            if isinstance(node.func, ast.Name) and node.func.id == "doc" and node.args:
                strings(node.args[0])
    return out


def technique_names_under_bench() -> list[tuple[str, int, str, str]]:
    """(module, line, name, the string) for every string in bench/'s code that spells a registered technique's
    name: the name alone, or as a word of a text (``try compile``, ``loader:workers=2``); an attribute of another
    library (``torch.compile``) and a longer word (``compiled``) are not the name. Docstrings and comments are
    prose about the code, not what it does, and are not read, nor are help texts and record-field docs
    (``_documentation``)."""
    names = sorted(techniques.registry(), key=len, reverse=True)
    word = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, names)) + r")(?![\w\-])")
    out = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        skip = _documentation(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for m in word.finditer(node.value):
                    out.append((module, node.lineno, m.group(1), node.value))
    return out


def test_the_harness_names_no_technique():
    found = [(m, line, name, text) for m, line, name, text in technique_names_under_bench()
             if name not in SAME_WORD and (m, name) not in ALLOWED]
    assert found == [], "bench/ names techniques (read what the technique declares instead):\n" + "\n".join(
        f"{m}:{line}: {name!r} in {text[:80]!r}" for m, line, name, text in found)


def test_every_allowed_name_is_still_there():
    """An allow-list entry the code no longer needs goes, so the list stays the list of real exceptions."""
    seen = {(m, name) for m, _, name, _ in technique_names_under_bench()}
    assert set(ALLOWED) <= seen, sorted(set(ALLOWED) - seen)
