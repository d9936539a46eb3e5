"""Where a sweep's records can be exported (``python -m bench export --to``), and what each target needs.

Constants only, apart from ``bench.report.exporters`` that writes them: the command line's parser names the targets
without importing the report package (its figures and statistics are most of ``python -m bench``'s start-up).
"""

from __future__ import annotations

TARGETS = ("parquet", "csv", "mlflow", "tensorboard")
# target -> (the extra of pyproject.toml, the modules it brings that the target imports)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "parquet": ("parquet", ("pyarrow",)),
    "mlflow": ("mlflow", ("mlflow",)),
    "tensorboard": ("tensorboard", ("tensorboard",)),
}
DEFAULT_OUT = {"parquet": "trials.parquet", "csv": "trials.csv", "mlflow": "mlflow.db", "tensorboard": "tensorboard"}
