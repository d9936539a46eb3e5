"""The layout's two promises, checked statically: no import cycle among bench/ and techniques/, and the harness's
reading side never names a technique (each technique carries its own reading: techniques/base.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The project modules ``name`` imports, at module level or inside functions (an import run later still
    closes a cycle), with the line of the first; imports under ``if TYPE_CHECKING:`` never run and are left out.
    Importing ``a.b.c`` also runs the packages ``a`` and ``a.b`` (their __init__), except the importer's own
    ancestors, which are always initialised before it."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if _type_checking_only(node):
            skipped.update(id(n) for n in ast.walk(node))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            dotted = ".".join(parts[:i])
            if dotted in known and dotted != name and not (name + ".").startswith(dotted + "."):
                found.setdefault(dotted, line)

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def test_the_cycle_finder_follows_function_level_imports_and_skips_type_checking_ones(tmp_path):
    files = {"bench/__init__.py": "", "bench/a.py": "import bench.b\n", "bench/b.py": "def f():\n    from bench import a\n",
             "techniques/__init__.py": "", "techniques/x.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
             "    from techniques import y\n", "techniques/y.py": "import techniques.x\n"}
    for file, text in files.items():
        (tmp_path / file).parent.mkdir(exist_ok=True)
        (tmp_path / file).write_text(text)
    assert import_cycles(tmp_path) == [["bench.a (line 1)", "bench.b (line 2)", "bench.a"]]


# ---- floors -------------------------------------------------------------------------------------------------

# The flow is config -> plan -> run -> record -> analyse -> report. Two floors are kept apart by name: what a
# technique may use of the harness (the parts a trial is built from), and the reading side, which works from
# records alone and never reaches back into running trials.
TECHNIQUES_MAY_USE = ("bench.text", "bench.files", "bench.measure", "bench.data", "bench.workloads",
                     "bench.structure")  # a model's described parts, which the workloads declare
READING = ("bench.analysis", "bench.findings", "bench.bottleneck", "bench.stats", "bench.summary", "bench.compare",
           "bench.report", "bench.docs_tables", "bench.exporters", "bench.columns", "bench.cost")
RUNNING = ("bench.trial", "bench.runner", "bench.loop", "bench.launcher", "bench.executors", "bench.ab", "bench.cli",
           "bench.reference", "bench.nodes", "bench.slurmjobs", "bench.guard", "bench.profile")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_techniques_use_only_the_floor_a_trial_is_built_from():
    known = _modules(ROOT)
    wrong = [f"{m} imports {t} (line {line})" for m, p in known.items() if m.startswith("techniques")
             for t, line in _imports(m, p, known).items()
             if t.startswith("bench") and t != "bench" and not _under(t, TECHNIQUES_MAY_USE)]
    assert wrong == [], "\n".join(wrong)


def test_the_reading_side_never_imports_the_running_side():
    known = _modules(ROOT)
    wrong = [f"{m} imports {t} (line {line})" for m, p in known.items() if _under(m, READING)
             for t, line in _imports(m, p, known).items() if _under(t, RUNNING)]
    assert wrong == [], "\n".join(wrong)


# ---- technique names under bench/ ---------------------------------------------------------------------------

# Where a string under bench/ may spell a technique's name, and why. Everything else (the report, the findings,
# the bottleneck diagnosis, "What to try next", the docs tables) reads what the techniques declare.
_PRESET = "the presets' technique sets: the default sweeps a user runs are configuration, as a TOML file is"
_DTYPE = "a dtype's short name (torch calls it so; the technique is named after it), for peaks and aliases"
ALLOWED: dict[tuple[str, str], str] = {
    ("bench.config", "bf16"): _PRESET + "; and the example of a technique list in a TOML error message",
    ("bench.config", "fp16"): _PRESET,
    ("bench.config", "grad_accum"): _PRESET,
    ("bench.config", "checkpointing"): _PRESET,
    ("bench.config", "compile"): _PRESET,
    ("bench.env", "bf16"): _DTYPE,
    ("bench.env", "fp16"): _DTYPE,
    ("bench.env", "tf32"): _DTYPE + "; and whether TF32 matmuls were on during a calibration",
    ("bench.plan", "deepspeed"): "the optional Python package of that name, whose presence the planner checks",
    ("bench.ab", "prune"): "git worktree prune",
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
