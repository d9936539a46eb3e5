"""trainbench: measure training-acceleration techniques side by side.

The Python API (docs/api.md): ``bench.sweep(...)`` runs a sweep and returns its trials as a DataFrame,
``bench.tune(...)`` searches for the best technique set for one model and returns its result,
``bench.load(DIR)`` reads a sweep's trials, ``bench.configurations(frame)`` compares technique sets,
``bench.export(DIR, to=...)`` writes them to Parquet, CSV, MLflow or TensorBoard;
``bench.ModelSpec`` is what a user's model ``build`` may return (docs/models.md). They are imported on first use,
so ``python -m bench`` does not pay for pandas or torch before it needs them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "sweep": ("bench.api", "sweep"),
    "tune": ("bench.api", "tune"),
    "load": ("bench.api", "load"),
    "configurations": ("bench.api", "configurations"),
    "export": ("bench.api", "export"),
    "ConfigError": ("bench.core.errors", "ConfigError"),
    "ModelSpec": ("bench.plan.user_models", "ModelSpec"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'bench' has no attribute {name!r}")
