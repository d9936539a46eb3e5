"""User code the harness loads by name: model files (``--model``), technique classes (``--technique``) and
installed plugins (entry points ``trainbench.techniques`` and ``trainbench.workloads``).

A source is ``path/to/file.py:attr`` or ``package.module:attr``. Every process of a sweep loads the same sources
(the trial spec and the reference process carry them as ``Plugin`` dicts), so a trial child registers a user's
model or technique exactly as the process that planned the sweep did. Loading failures are ``PluginError``s: one
line naming the source, what went wrong and what is expected (the CLI prints it and exits 2).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.core.errors import ConfigError
from bench.core.text import shown

log = logging.getLogger(__name__)

TECHNIQUE_GROUP = "trainbench.techniques"
WORKLOAD_GROUP = "trainbench.workloads"


class PluginError(ConfigError):
    """User code could not be loaded or does not follow the protocol; the message says what is expected."""


@dataclass(frozen=True)
class Origin:
    """Where loaded code came from: a file (absolute path and its sha256) or an importable module."""

    source: str  # as resolved: "/abs/path/file.py:attr" or "package.module:attr"
    file: str | None
    module: str
    attr: str
    sha256: str | None

    def record(self) -> dict[str, Any]:
        return {"file": self.file, "module": None if self.file else self.module, "function": self.attr,
                "sha256": self.sha256}


@dataclass(frozen=True)
class Plugin:
    """One source every process of a sweep loads: a model (``kind="model"``) or a technique class."""

    kind: str  # "model" | "technique"
    source: str  # resolved: an absolute file path, or a module name, then ":attr"
    name: str | None = None  # a model's workload name
    blocks: str | None = None  # a model's blocks path, when given (--blocks)
    path: str | None = None  # the sys.path entry a module source was found under, put on sys.path in child
    # processes (they run in the harness's directory, not the user's)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def split_source(text: str, what: str) -> tuple[str, str]:
    """``"path.py:build"`` -> ("path.py", "build"); the attribute after the last colon is required."""
    where, sep, attr = str(text).strip().rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise PluginError(f"{what} {shown(text)} must be PATH.py:NAME or package.module:NAME "
                          f"(e.g. my_model.py:build)")
    return where, attr


def is_file_source(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def resolve(text: str, what: str) -> str:
    """The source with a file path made absolute (children run in another directory); checks the file exists."""
    where, attr = split_source(text, what)
    if not is_file_source(where):
        return f"{where}:{attr}"
    path = Path(where).expanduser()
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "does not exist"
        raise PluginError(f"{what} {shown(text)}: the file {shown(str(path))} {why} (give PATH.py:NAME)")
    return f"{path.resolve()}:{attr}"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest(source: str) -> str | None:
    """The sha256 of the file a resolved source's code lives in (a module's file), or None when there is none."""
    where, _ = split_source(source, "source")
    if is_file_source(where):
        path = Path(where)
    else:
        try:
            spec = importlib.util.find_spec(where)
        except (ImportError, ValueError):
            return None
        path = Path(spec.origin) if spec and spec.origin and spec.origin not in ("built-in", "frozen") else None
    return sha256_of(path) if path is not None and path.is_file() else None


def search_path(source: str) -> str | None:
    """The sys.path entry a module source's top-level package was found under (its parent directory), so child
    processes import the same code; None for a file source (it puts its own directory there)."""
    where, _ = split_source(source, "source")
    if is_file_source(where):
        return None
    try:
        spec = importlib.util.find_spec(where.split(".")[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the directory holding it
        return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)
    return str(Path(spec.origin).resolve().parent) if spec.origin and Path(spec.origin).is_file() else None


def use_path(plugin: Plugin) -> None:
    """Make a plugin's code importable here (appended: the harness's own modules keep their names)."""
    if plugin.path and plugin.path not in sys.path:
        sys.path.append(plugin.path)


def load_attr(text: str, what: str) -> tuple[Any, Origin]:
    """The object ``NAME`` of the source and where it came from. Import errors inside the user's code are reported
    in one line with their type and message."""
    source = resolve(text, what)
    where, attr = split_source(source, what)
    if is_file_source(where):
        path = Path(where)
        module = _import_file(path, what, text)
        origin = Origin(source, str(path), module.__name__, attr, sha256_of(path))
    else:
        module = _import_module(where, what, text)
        file = getattr(module, "__file__", None)
        origin = Origin(source, None, where, attr, sha256_of(Path(file)) if file and Path(file).is_file() else None)
    if not hasattr(module, attr):
        defined = sorted(n for n, v in vars(module).items()
                         if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__)
        raise PluginError(f"{what} {shown(text)}: {shown(where)} defines no {shown(attr)} "
                          f"(it defines: {', '.join(defined[:8]) or 'nothing callable'})")
    return getattr(module, attr), origin


def _import_file(path: Path, what: str, text: str) -> ModuleType:
    # One module per file (name from its path's digest), importable again by that name in this process: pickling
    # (DataLoader workers) and a second --model naming the same file find the module already loaded.
    # The digest of the content is in the name: an edited file (a notebook's second sweep) is imported afresh.
    name = f"trainbench_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}_{sha256_of(path)[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{what} {shown(text)}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:  # the user's file may import its neighbours (appended: an installed
        sys.path.append(str(path.parent))  # module of the same name wins, unlike `python file.py`)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise PluginError(f"{what} {shown(text)}: importing {path.name} raised {_one_line(exc)}") from None
    return module


def _import_module(name: str, what: str, text: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise PluginError(f"{what} {shown(text)}: no module named {shown(exc.name)} (give an importable "
                              "package.module or a PATH.py)") from None
        raise PluginError(f"{what} {shown(text)}: importing {name} raised {_one_line(exc)}") from None
    except Exception as exc:
        raise PluginError(f"{what} {shown(text)}: importing {name} raised {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


# ---- registering --------------------------------------------------------------------------------------------


def register_technique(text: str) -> Plugin:
    """Load a ``Technique`` subclass from ``path.py:ClassName`` and register it under its ``name``."""
    from techniques import base as tbase

    cls, origin = load_attr(text, "--technique")
    if not (isinstance(cls, type) and issubclass(cls, tbase.Technique)) or cls is tbase.Technique:
        raise PluginError(f"--technique {shown(text)}: {origin.attr} is not a subclass of techniques.Technique "
                          "(see docs/plugins.md)")
    if not getattr(cls, "name", None) or not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise PluginError(f"--technique {shown(text)}: {origin.attr} needs a class attribute `name`, a Python "
                          "identifier such as 'my_technique'")
    _register_technique_class(cls, origin.source)
    return Plugin("technique", origin.source, path=search_path(origin.source))


def _register_technique_class(cls: type, source: str) -> None:
    from techniques import base as tbase

    try:
        _register("technique", cls, source, tbase.registry(), tbase.register)
    except TypeError as exc:  # what every technique declares (own_flops, hides_tensors, tune_options): say so
        raise PluginError(f"{source}: {exc}") from None


def register_workload_class(cls: type, source: str) -> None:
    from bench.workloads import base as wbase

    if not (isinstance(cls, type) and issubclass(cls, wbase.Workload)):
        raise PluginError(f"{source} is not a subclass of bench.workloads.Workload")
    try:
        _register("workload", cls, source, wbase.registry(), wbase.register)
    except TypeError as exc:  # sizes that are not Size dataclasses
        raise PluginError(f"{source}: {exc}") from None


_SOURCES: dict[tuple[str, str], str] = {}  # (kind, name) -> the source that registered it in this process


def technique_origin(name: str) -> dict[str, Any] | None:
    """Where a plugin technique came from, for its trial records: its source and the file's sha256 (an installed
    package's entry point names the package and version); None for a built-in technique."""
    source = _SOURCES.get(("technique", name))
    if source is None:
        return None
    if source.startswith("entry point"):
        return {"source": source}
    return {"source": source, "sha256": digest(source)}


def _register(kind: str, cls: Any, source: str, known: dict[str, Any], register: Any) -> None:
    """Register ``cls`` under its name; the same name from another source is an error naming both."""
    other = known.get(cls.name)
    if other is not None and other is not cls:
        where = _SOURCES.get((kind, cls.name)) or f"{other.__module__}.{other.__qualname__}"
        raise PluginError(f"{kind} name {shown(cls.name)} is defined twice: by {where} and by {source}; "
                          "rename one of them")
    register(cls)
    _SOURCES[(kind, cls.name)] = source


# ---- entry points ---------------------------------------------------------------------------------------------


_ENTRY_POINTS_LOADED = False


def load_entry_points() -> None:
    """Register the techniques and workloads of installed packages (entry point groups ``trainbench.techniques``
    and ``trainbench.workloads``; each entry point names a class). Once per process; a broken plugin is an error
    naming its package."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    from techniques import base as tbase

    for group, register in ((TECHNIQUE_GROUP, _register_technique_class), (WORKLOAD_GROUP, register_workload_class)):
        for ep in importlib.metadata.entry_points(group=group):
            dist = getattr(ep.dist, "name", None) or "?"
            version = getattr(ep.dist, "version", None) or "?"
            label = f"entry point {ep.name} = {ep.value} (package {dist} {version}, group {group})"
            try:
                cls = ep.load()
            except Exception as exc:
                raise PluginError(f"{label} failed to load: {_one_line(exc)}; fix or uninstall {dist}") from None
            if group == TECHNIQUE_GROUP and not (isinstance(cls, type) and issubclass(cls, tbase.Technique)):
                raise PluginError(f"{label} is not a subclass of techniques.Technique")
            if not isinstance(getattr(cls, "name", None), str) or not cls.name:
                raise PluginError(f"{label} has no class attribute `name`")
            register(cls, label)
    _ENTRY_POINTS_LOADED = True
