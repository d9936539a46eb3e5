"""Training-acceleration techniques. Importing this package registers every built-in technique.

Every public module of the package is imported, in sorted order of module name, so a technique exists when its
module is here (``techniques/<name>.py`` with an ``@register`` class): there is no list to add it to. Private
modules (``_*.py``) are helpers the techniques import themselves. The registry's order is therefore the sorted
order of the modules (what "What to try next" lists remedies in); a duplicate name still fails (``register``).
Third-party techniques come from entry points or ``--technique path.py:Class`` instead (``bench.plan.plugins``).
"""

import importlib
import pkgutil

from techniques.base import Context, Kind, OptionError, Phase, Technique, TrainConfig, get, register, registry

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")
del _module

__all__ = ["Context", "Kind", "OptionError", "Phase", "Technique", "TrainConfig", "get", "register", "registry"]
