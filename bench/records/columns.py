"""The dtypes of ``bench.load``'s frame: numbers as numbers, labels as categoricals, start times as datetimes.

The analysis works on a frame of Python objects (``bench.records.frame.records_frame``: None for missing, so its
formatting code can test ``is None``). A user's notebook wants the opposite: ``describe()``, ``plot`` and ``groupby``
need float64 and Int64 columns, and ``frame.status == "ok"`` should be cheap. ``typed`` turns the one into the other
and ``untyped`` turns it back (``bench.configurations`` takes either), so both views stay one source of truth.

``COLUMN_DTYPES`` names each column's dtype; docs/api.md lists the same (a test holds them together).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bench.records.results import PARITY_ANSWERS, STATUSES

FLOAT, INT, BOOL, CATEGORY, TEXT, TIME, OBJECT = (
    "float64", "Int64", "boolean", "category", "string", "datetime64[us, UTC]", "object")


def _each(dtype: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), dtype)


COLUMN_DTYPES: dict[str, str] = {
    **_each(CATEGORY, "source machine sweep_id workload technique kind mode device status compute_dtype metric "
                      "parity_kind parity_answer"),
    **_each(TEXT, "trial_id reason breakdown_skipped cut stopped_by parity_note zero_note added_by continues "
                  "inductor_cache"),  # cold | warm | None: text, since most sweeps hold no value (no category)
    **_each(TIME, "timestamp_utc"),
    # Nested values (tuples, lists, dicts) stay Python objects: there is no flat dtype for a curve.
    **_each(OBJECT, "key names components notes contention_retries recipe curve curve_extra mem_held technique_results rank_peak_rss_bytes continuation "
                    "stages"),
    **_each(BOOL, "contended quality_contended higher_is_better parity_ok"),
    **_each(INT, "seed repeat position batch_size window_steps flops_per_step peak_bytes peak_rss_bytes "
                 "mem_params_bytes mem_grads_bytes mem_optimizer_bytes mem_activations_bytes mem_other_bytes "
                 "budget_samples samples_trained samples_to_target steps_to_target world_size n_params "
                 "clean_rss_at_rest_bytes clean_rss_peak_bytes model_state_bytes state_params_bytes "
                 "state_grads_bytes state_optimizer_bytes zero_stage max_looks threads cores devices trained_params"),
    **_each(FLOAT, "first_step_s one_off_s probe_s samples_per_s tokens_per_s step_time_s step_time_iqr_s "
                   "data_wait_frac contention_frac achieved_flops peak_flops mfu mfu_datasheet target final "
                   "train_time_s time_to_target_s time_to_target_one_off_s parity_loss_diff parity_start_diff "
                   "parity_distance_diff parity_loss_tol parity_distance_tol energy_j phase_step_s phase_data_share phase_h2d_share "
                   "phase_forward_share phase_backward_share phase_optimizer_share phase_other_share phase_device_busy "
                   "phase_device_op_s "
                   "samples_per_s_per_device zero_formula_bytes wall_s margin parity_harmless_drift "
                   "parity_bug_loss_drift parity_bug_distance_drift parity_k_tol quality_contention_frac"),
}

# Categories in a fixed order where the values are known (a status count shows every status), else in order of
# first appearance (the run order, so the baseline usually comes first).
_KNOWN_CATEGORIES = {"status": list(STATUSES), "mode": ["speed", "quality", "both"],
                     "kind": ["exact", "numeric", "algorithmic"], "parity_answer": list(PARITY_ANSWERS)}


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of an analysis frame (Python objects, None for missing) with each column in its ``COLUMN_DTYPES``
    dtype: NaN / <NA> / NaT for missing. Columns it does not know are left as they are."""
    out = frame.copy()
    for col in out.columns:
        dtype = COLUMN_DTYPES.get(col)
        if dtype is not None:
            out[col] = _as(out[col], col, dtype)
    return out


def _as(series: pd.Series, col: str, dtype: str) -> pd.Series:
    values = [None if _missing(v) else v for v in series]
    if dtype == OBJECT:
        return pd.Series(values, index=series.index, dtype=object)
    if dtype == TIME:
        stamps = pd.to_datetime(pd.Series([v or None for v in values], index=series.index, dtype=object),
                                utc=True, format="ISO8601", errors="coerce")  # "" (a bare record): NaT
        return stamps.dt.as_unit("us")
    if dtype == CATEGORY:
        seen = list(dict.fromkeys(v for v in values if v is not None))
        known = _KNOWN_CATEGORIES.get(col, [])
        categories = known + [v for v in seen if v not in known]
        return pd.Series(pd.Categorical(values, categories=categories), index=series.index)
    return pd.Series(pd.array(values, dtype=dtype), index=series.index)


def untyped(frame: pd.DataFrame) -> pd.DataFrame:
    """The analysis's view of a frame ``typed`` made (or of one it did not: then nothing changes): Python objects,
    None for missing, start times as the records' ISO text."""
    out = {}
    for col in frame.columns:
        series = frame[col]
        if isinstance(series.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_any_dtype(series.dtype):
            values = [None if pd.isna(v) else v.isoformat() for v in series]
        else:
            values = [None if _missing(v) else _plain(v) for v in series.tolist()]
        out[col] = pd.Series(values, index=frame.index, dtype=object)
    return pd.DataFrame(out, index=frame.index, columns=frame.columns)


def _missing(value: Any) -> bool:
    """None, NaN, <NA> or NaT; never true of a tuple or list (``pd.isna`` would answer element by element)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, list | tuple | dict) else value
