"""What the techniques found, per configuration: the LR a range test chose, the batch a search chose (and the
critical batch size it estimated), where early stopping stopped, what a curriculum trained on, what local SGD and
federated averaging communicated, what the model-changing techniques built (a teacher, a pretrained checkpoint and
their one-off cost amortised over the trials that shared them, sparsity, parameter counts, a converted model's
quality).

The numbers come from each record's ``technique_results`` (one entry per technique that reports one); the seeds of a
configuration are listed side by side, so a finding that changes from seed to seed shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from bench.report.content import Cell, Table, fmt_bytes, fmt_secs

# Seeds listed one by one up to this many; beyond, the median and range.
LISTED = 6


def _g(x: float | None) -> str:
    if x is None:
        return "-"
    return str(x) if isinstance(x, int) else f"{x:.3g}"


def _values(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    if len(got) > 1 and len(set(got)) == 1:
        return f"{_g(got[0])} (each of {len(got)})"
    if len(got) <= LISTED:
        return ", ".join(_g(x) for x in got)
    return f"median {_g(float(np.median(got)))} (range {_g(min(got))}-{_g(max(got))}, n={len(got)})"


def _lr_finder(found: list[dict[str, Any]]) -> str:
    rule = found[0].get("rule")
    chosen = _values([f.get("chosen_lr") for f in found])
    other = "valley" if rule == "steepest" else "steepest"
    alt = _values([(f.get("suggestions") or {}).get(other) for f in found])
    fell = sum(bool(f.get("fell_back")) for f in found)
    text = (f"chosen LR ({rule} rule): {chosen}; the {other} rule would give {alt}; the workload's default "
            f"{_g(found[0].get('default_lr'))}")
    return text + (f"; {fell} probe(s) found no suggestion and kept the default" if fell else "")


def _batch_size(found: list[dict[str, Any]]) -> str:
    mode = found[0].get("mode")
    text = f"mode {mode}: trained at batch {_values([f.get('batch_size') for f in found])} " \
           f"(default {found[0].get('default_batch_size')}), LR {_values([f.get('lr_after') for f in found])} " \
           f"({found[0].get('rule')} rule)"
    if mode == "noise":
        text += f"; critical batch size B_simple {_values([f.get('b_simple') for f in found])}"
        failed = sum(bool(f.get("estimate_failed")) for f in found)
        if failed:
            text += (f" ({failed} estimate(s) failed: the noise swamped the mean gradient; those kept the default "
                     "batch)")
    return text


def _early_stopping(found: list[dict[str, Any]]) -> str:
    ran = [f for f in found if f.get("evaluations")]
    if not ran:
        return "no evaluation in these trials (speed only): nothing to stop"
    stopped = [f for f in ran if f.get("stopped")]
    if not stopped:
        return f"never stopped ({len(ran)} runs): the metric kept improving within the patience"
    saved = _values([f.get("steps_saved_frac") for f in stopped])
    return f"stopped {len(stopped)}/{len(ran)} runs, saving {saved} of the planned steps"


def _curriculum(found: list[dict[str, Any]]) -> str:
    first = found[0]
    if "full_length" in first:
        lengths = [int(k) for k in first.get("warmup_lengths") or {}]
        if not lengths:
            return f"order {first['order']}: no length warm-up (warmup=0): every step at {first['full_length']}"
        share = first.get("tokens_fraction_of_plan")
        return (f"order {first['order']}: lengths {min(lengths)}-{max(lengths)} of {first['full_length']} over "
                f"{first['warmup_steps']} steps" + (f"; {share:.0%} of the plan's tokens" if share is not None else ""))
    scorer = first.get("scorer") or {}
    cost = max((f.get("scorer") or {}).get("scorer_train_s") or 0 for f in found)
    return (f"order {first['order']}, pool from {first['start']:.0%} to all over {first['warmup']:.0%} of the steps; "
            f"difficulty = loss of a scorer trained {scorer.get('steps')} steps once ({fmt_secs(cost)}, cached and "
            "shared by every trial of the sweep)")


def _lr_schedule(found: list[dict[str, Any]]) -> str:
    first = found[0]
    peaks = _values([f.get("peak_lr") for f in found])
    return f"{first['schedule']}, peak LR {peaks} over {first['planned_steps']} steps"


def _compile(found: list[dict[str, Any]]) -> str:
    graphs = [f.get("graphs") for f in found]
    if all(g == 0 for g in graphs):
        return "captured no graph: TorchDynamo skipped the model, so these trials ran eager (not a compile result)"
    return f"graphs compiled {_values(graphs)}; graph breaks {_values([f.get('graph_breaks') for f in found])}"


def _local_sgd(found: list[dict[str, Any]]) -> str:
    first = found[0]
    runs = [(f.get("communication") or {}).get("quality_run") or {} for f in found]
    if not any(r.get("steps") for r in runs):
        return f"H={first['period']} after {first['warmup']} DDP steps; no quality run in these trials"
    per_sample = _values([r.get("bytes_per_sample") for r in runs])
    share = _values([r["bytes"] / (r["steps"] * f["ddp_bytes_per_step"]) for r, f in zip(runs, found, strict=True)
                     if r.get("steps") and f.get("ddp_bytes_per_step")])
    return (f"H={first['period']} after {first['warmup']} DDP steps: {per_sample} bytes per sample all-reduced by "
            f"each rank in the quality run, {share} of DDP's bytes in the same steps")


def _fedavg(found: list[dict[str, Any]]) -> str:
    first = found[0]
    skew = _values([(f.get("label_skew") or {}).get("mean_tv_distance") for f in found])  # "-": not class labels
    rounds = _values([(f.get("rounds_completed") or {}).get("quality_run") for f in found])
    fed = first.get("federated") or {}
    unaveraged = [f.get("quality_run_steps_after_last_round") for f in found]
    tail = (f"; the final evaluation misses the last {_values(unaveraged)} steps (a round unfinished at the budget's "
            "end)" if any(unaveraged) else "")
    return (f"{first['participants_per_round']} of {first['clients']} clients per round, {first['steps_per_round']} "
            f"steps a round; label skew (mean TV distance to the whole set, 0 = IID) {skew}; {rounds} rounds in "
            f"the quality run; a deployment sends {fmt_bytes(fed.get('bytes_down_per_round'))} down and as much up "
            f"per round (MiB over the quality run: "
            f"{_values([_mib((f.get('federated') or {}).get('quality_run_bytes')) for f in found])})" + tail)


def _tp(found: list[dict[str, Any]]) -> str:
    first = found[0]
    per_sample = _values([((f.get("communication") or {}).get("quality_run") or {}).get("bytes_per_sample")
                          for f in found])
    calls = (first.get("communication_detail") or {}).get("collectives_per_step")
    return (f"degree {first['degree']}: {first['local_heads']} of {first['n_head']} heads per rank, "
            f"{fmt_bytes(first.get('param_bytes_per_rank'))} of parameters per rank; {calls} all-reduces a step, "
            f"{per_sample} bytes per sample passed by each rank in the quality run")


def _pp(found: list[dict[str, Any]]) -> str:
    first = found[0]
    bubble = first.get("bubble") or {}
    stages = range(first.get("stages") or 0)
    measured = "; ".join(f"stage {s} {_values([((f.get('bubble') or {}).get('measured_per_stage') or [None] * (s + 1))[s] for f in found])}"
                         for s in stages)
    sent = _values([((f.get("communication") or {}).get("quality_run") or {}).get("bytes_per_sample") for f in found])
    return (f"{first['schedule']}, {first['microbatches']} micro-batches over {first['stages']} stages (blocks "
            f"{first.get('layers_per_stage')}): measured bubble {measured}, against (p - 1) / (m + p - 1) = "
            f"{_g(bubble.get('formula'))}; stage 0 sends {sent} bytes per sample")


def _small_bytes(n: int | None) -> str:
    """Bytes, exact below 10 KiB (a tiny model's KV cache per token would round to "0 KiB")."""
    return fmt_bytes(n) if n is None or n >= 10 * 1024 else f"{n:,} B"


def _n(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _once(found: list[dict[str, Any]], seconds: str, what: str) -> str:
    """How often a cached artefact (teacher, checkpoint) was trained in these trials and what it cost per trial."""
    trained = [f.get(seconds) or 0.0 for f in found if not f.get("cached")]
    cost = max((f.get(seconds) or 0.0 for f in found), default=0.0)
    if not trained:
        return f"{what} in {fmt_secs(cost)} by an earlier trial (all {len(found)} loaded it from the sweep's cache)"
    return (f"{what} in {fmt_secs(cost)} ({len(trained)} of these {len(found)} trials trained it, the others loaded "
            f"it from the sweep's cache): {fmt_secs(sum(trained) / len(found))} per trial here, outside their "
            "one-off costs")


def _distill(found: list[dict[str, Any]]) -> str:
    first = found[0]
    metric = (first.get("teacher_eval") or {}).get(first.get("teacher_metric") or "")
    return (f"teacher {_n(first.get('teacher_n_params'))} params ({first.get('width')}x width, {first.get('depth')}x "
            f"depth; student {_n(first.get('student_n_params'))}), {first.get('teacher_metric')} {_g(metric)} after "
            f"{first.get('teacher_steps_trained')} steps, " + _once(found, "teacher_train_s", "trained") +
            f"; alpha {first.get('alpha')}, T {first.get('temperature')}")


def _transfer(found: list[dict[str, Any]]) -> str:
    first = found[0]
    source = first.get("source") or {}
    text = (f"pretrained {first.get('pretrain_steps')} steps on {source.get('task')} (loss "
            f"{_g(first.get('source_first_loss'))} -> {_g(first.get('source_final_loss'))}), "
            + _once(found, "pretrain_s", "trained"))
    if first.get("head_reinitialised"):
        text += "; classifier head re-initialised"
    if first.get("source_overlaps_target"):
        text += "; the source images overlap the fine-tune's training set"
    return text


def _freeze(found: list[dict[str, Any]]) -> str:
    first = found[0]
    return (f"first {first.get('blocks')} block(s) and the input layers frozen: {_n(first.get('frozen_params'))} "
            f"params ({_n(first.get('trainable_params'))} still train); optimizer state {fmt_bytes(first.get('optimizer_state_bytes_saved'))} "
            f"and gradients {fmt_bytes(first.get('grad_bytes_saved'))} saved")


def _prune(found: list[dict[str, Any]]) -> str:
    first = found[0]
    reached = _values([f.get("sparsity") for f in found])
    if first.get("mode") == "structured":
        if all(f.get("params_after") is None for f in found):
            return f"structured: never reached its step {first.get('start_step')}; nothing was removed"
        return (f"structured: {first.get('target'):.0%} of the hidden channels removed at step {first.get('start_step')} "
                f"(channel sparsity {reached}); params {_n(first.get('params_before'))} -> "
                f"{_n(first.get('params_after'))}")
    return (f"unstructured ({first.get('scope')}): {reached} of {_n(first.get('weights'))} weights zero at the end "
            f"(target {first.get('target'):.0%}); masks leave dense matmuls as large as before")


def _qat(found: list[dict[str, Any]]) -> str:
    first = found[0]
    metric = first.get("metric") or ""
    errors = [f["conversion_error"] for f in found if f.get("conversion_error")]
    if errors:
        return f"{first.get('fake_quantized_layers')} Linear layers fake-quantized; conversion failed: {errors[0]}"

    def of(kind: str) -> str:
        return _values([((f.get("metrics") or {}).get(kind) or {}).get(metric) for f in found])

    wb = first.get("weight_bytes") or {}
    return (f"{first.get('fake_quantized_layers')} Linear layers fake-quantized; {metric} at the trial's end (after "
            f"{_values([f.get('trained_steps') for f in found])} steps: the quality run's and the timed window's): "
            f"fake-quant {of('fake_quant')}, float weights {of('float')}, int8 converted {of('int8')}; those layers' "
            f"weights {_small_bytes(wb.get('float'))} -> {_small_bytes(wb.get('int8'))}")


def _efficient_arch(found: list[dict[str, Any]]) -> str:
    first = found[0]
    text = (f"params {_n(first.get('n_params_before'))} -> {_n(first.get('n_params_after'))}, forward FLOPs per sample "
            f"x{_g(first.get('flops_ratio'))}")
    if "kv_heads" in first:
        text = (f"{first['kv_heads']} KV head(s) for {first.get('n_head')} query heads: " + text +
                f"; KV cache per token {_small_bytes(first.get('kv_cache_bytes_per_token_before'))} -> "
                f"{_small_bytes(first.get('kv_cache_bytes_per_token_after'))}")
        if first.get("attention_flops_counted") is False:
            text += " (attention's own FLOPs not counted on this device)"
    else:
        text = f"{first.get('convs_replaced')} 3x3 convs depthwise-separable: " + text
    return text


def _mtp(found: list[dict[str, Any]]) -> str:
    first = found[0]
    depths = sorted({k for f in found for k in (f.get("aux_loss_last") or {})})
    last = "; ".join(f"{d} {_values([(f.get('aux_loss_last') or {}).get(d) for f in found])}" for d in depths)
    return (f"{first.get('variant')}, n={first.get('n')}, weight {_g(first.get('weight'))}: "
            f"{_n(first.get('extra_params'))} extra params, evaluated on the next-token head only; last auxiliary "
            f"losses {last}")


def _mib(n: float | None) -> float | None:
    return None if n is None else n / 2**20


SUMMARIES: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "lr_finder": _lr_finder, "batch_size": _batch_size, "early_stopping": _early_stopping,
    "curriculum": _curriculum, "lr_schedule": _lr_schedule, "compile": _compile, "local_sgd": _local_sgd,
    "fedavg": _fedavg, "tp": _tp, "pp": _pp, "distill": _distill, "transfer": _transfer, "freeze": _freeze,
    "prune": _prune, "qat": _qat, "efficient_arch": _efficient_arch, "mtp": _mtp,
}


def _class_summary(name: str) -> Callable[[list[dict[str, Any]]], str] | None:
    """The technique class's own reading (``summarize(cls, found)``), when it is registered here and has one."""
    try:
        import techniques
    except ImportError:  # a report rendered without torch: the records' own text only
        return None
    cls = techniques.registry().get(name)
    return getattr(cls, "summarize", None) if cls is not None else None


def tuning_table(frame: pd.DataFrame, where: Callable[[str, str], str]) -> Table | None:
    """One row per configuration and technique that reported findings; ``where(machine, workload)`` names it."""
    ok = frame[frame["status"] == "ok"]
    rows = []
    for (machine, workload, technique), g in ok.groupby(["machine", "workload", "technique"], sort=False):
        per_name: dict[str, list[dict[str, Any]]] = {}
        for results in g.sort_values("seed")["technique_results"]:
            for name, found in (results or {}).items():
                per_name.setdefault(name, []).append(found)
        for name, found in per_name.items():
            summary = SUMMARIES.get(name) or _class_summary(name)
            text = summary(found) if summary else "see technique_results in the records"
            rows.append([Cell(where(machine, workload)), Cell(technique), Cell(name), Cell(text)])
    if not rows:
        return None
    return Table(["where", "technique set", "technique", "what it found (seeds in order)"], rows, wrap=(3,))
