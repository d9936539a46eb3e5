"""Hand-made schema-2 records for tests and fixtures: only the fields a test sets, the rest as a real record of
that status would have them."""

from __future__ import annotations

from typing import Any

from bench.records.results import (
    PARITY_K_TOL,
    PARITY_TOLERANCES,
    BuildInfo,
    Contention,
    MemoryResult,
    ParityResult,
    QualityResult,
    SpeedResult,
    StepStats,
    TrialRecord,
    parity_answer,
)

IDLE = Contention(other_cpu_s=0.0, window_s=1.0, ncpu=2, fraction=0.0)


def parity(kind: str = "exact", loss: float = 0.0, distance: float = 0.0, tol: tuple[float, float] = (1e-3, 1e-3),
           note: str | None = None, steps: int = 8) -> ParityResult:
    return ParityResult(kind=kind, steps=steps, ok=loss <= tol[0] and distance <= tol[1], loss_rel_diff=loss,
                        distance_rel_diff=distance, loss_tolerance=tol[0], distance_tolerance=tol[1],
                        losses=[2.0] * steps, reference_losses=[2.0] * steps, distances=[0.1] * steps,
                        reference_distances=[0.1] * steps, note=note, reference="ref")


def calibrated(kind: str = "numeric", loss: float = 0.0, distance: float = 0.0, harmless: float = 1e-3,
               bug: tuple[float, float] = (0.2, 0.1), steps: int = 8) -> ParityResult:
    """A parity result judged as ``bench.reference.judge`` judges one: tolerances k_tol x the harmless drifts
    (``harmless`` for the loss, a tenth of it for the distance) above the kind's floors, and the bug's drifts."""
    floor, dist_floor = PARITY_TOLERANCES[kind]
    tol, dist_tol = max(floor, PARITY_K_TOL * harmless), max(dist_floor, PARITY_K_TOL * harmless / 10)
    return ParityResult(kind=kind, steps=steps, ok=loss <= tol and distance <= dist_tol, loss_rel_diff=loss,
                        distance_rel_diff=distance, loss_tolerance=tol, distance_tolerance=dist_tol,
                        losses=[2.0] * steps, reference_losses=[2.0] * steps, distances=[0.1] * steps,
                        reference_distances=[0.1] * steps, note=None, reference="ref",
                        answer=parity_answer([(loss, tol, bug[0]), (distance, dist_tol, bug[1])]),
                        harmless="initial weights x (1 + 2^-11 u)", harmless_loss_drift=harmless,
                        harmless_distance_drift=harmless / 10, bug_loss_drift=bug[0], bug_distance_drift=bug[1],
                        k_tol=PARITY_K_TOL)


def curve_of(final: float, start: float, budget_samples: int, batch: int, train_time_s: float, points: int = 2
             ) -> list[list[Any]]:
    """A straight-line eval curve from ``start`` to ``final`` over ``points`` evaluations after the first."""
    steps = budget_samples // batch
    out: list[list[Any]] = [[0, 0, 0.0, None, start]]
    for i in range(1, points + 1):
        f = i / points
        out.append([round(budget_samples * f), round(steps * f), train_time_s * f, 2.0 - f, start + (final - start) * f])
    return out


def record(label: str = "baseline", seed: int = 0, *, workload: str = "mlp", size: str = "tiny",
           status: str = "ok", reason: str | None = None, sweep_id: str = "s", repeat: int | None = None,
           position: int = 0, world_size: int = 1, mode: str = "both", kind: str | None = None,
           batch: int = 64, n_params: int = 1000,
           sps: float | None = 100.0, step: float | None = None, first: float | None = None,
           one_off: float | None = None, data_wait: float | None = None, contended: bool = False,
           mfu: float | None = None, dtype: str = "float32", flops: int | None = None, peak_flops: float | None = None,
           peak: int | None = None, rss: int | None = None, breakdown: dict | None = None,
           breakdown_skipped: str | None = None,
           metric: str = "acc", higher: bool = True, final: float | None = None, start: float | None = None,
           curve: list[list[Any]] | None = None, target: float | None = None, ttt: float | None = None,
           stt: int | None = None, train_time: float = 1.0, budget_samples: int = 640, cut: str | None = None,
           parity_result: ParityResult | None = None, memory: MemoryResult | None = None,
           notes: list[str] | None = None, threads: int | None = None, quality_contention: float = 0.0,
           technique_results: dict | None = None, trained_params: int | None = None) -> TrialRecord:
    names = [] if label == "baseline" else [p.split(":")[0] for p in label.split("+")]
    kind = kind or ("numeric" if {"bf16", "fp16", "tf32"} & set(names) else "exact")
    head: dict[str, Any] = dict(
        sweep_id=sweep_id, trial_id=f"{workload}:{size}/{label}/seed{seed}/r{seed if repeat is None else repeat}",
        workload={"name": workload, "size": size, "metric": metric, "higher_is_better": higher, "target": target,
                  "batch_size": batch, "n_params": n_params},
        techniques=[{"name": n, "options": {}} for n in names], technique_label=label, seed=seed,
        repeat=seed if repeat is None else repeat, world_size=world_size, device="cpu", status=status,
        reason=reason, kind=kind, mode=mode, position=position, notes=notes or [],
    )
    if status != "ok":
        return TrialRecord(**head)
    # torchrun gives each rank 1 thread on a CPU unless --threads says otherwise (bench.run.launcher): the same
    # 2 cores as a one-process trial's 2 threads
    threads = threads if threads is not None else (2 if world_size == 1 else 1)
    build = BuildInfo(n_params=n_params, batch_size=batch, micro_batches=1, tokens_per_sample=0, threads=threads,
                      first_step_s=first, one_off_s=one_off, trained_params=trained_params,
                      resources={"ranks": world_size, "threads": threads, "cores": world_size * threads,
                                 "devices": 0})
    speed = None
    if sps is not None and mode != "quality":
        achieved = flops * sps / batch if flops else None
        speed = SpeedResult(
            warmup_steps=3, steps=20, window_s=20 * batch / sps,
            step_time_s=StepStats(median=step or batch / sps, iqr=0.0, min=None, max=None, mean=None, n=20),
            samples_per_s=sps, samples_per_s_per_device=sps / world_size, tokens_per_s=None,
            data_wait_frac=data_wait, contention=Contention(0.0, 1.0, 2, 0.5 if contended else 0.0),
            contended=contended, flops_per_step=flops, achieved_flops=achieved, compute_dtype=dtype,
            peak_flops=peak_flops, peak_source="test" if peak_flops else None, mfu=mfu,
            datasheet_peak_flops=None, mfu_datasheet=None)
    quality = None
    if (final is not None or curve is not None) and mode != "speed":
        if curve is None:
            curve = curve_of(final, final if start is None else start, budget_samples, batch, train_time)
        if ttt is not None and stt is None:
            stt = budget_samples
        quality = QualityResult(
            metric=metric, higher_is_better=higher, target=target, budget_samples=budget_samples,
            budget_steps=budget_samples // batch, samples_trained=curve[-1][0], steps_trained=curve[-1][1],
            train_time_s=curve[-1][2], cut=cut, stopped_by=None, curve_columns=["samples", "steps", "train_time_s", "train_loss", metric],
            curve=curve, final=None if cut else curve[-1][-1], samples_to_target=stt,
            steps_to_target=stt // batch if stt is not None else None, time_to_target_s=ttt,
            time_to_target_with_one_off_s=(ttt + (one_off or 0.0)) if ttt is not None else None,
            contention=Contention(quality_contention * train_time * 2, train_time, 2, quality_contention)
            if quality_contention else IDLE, contended=quality_contention > 0.10)
    if memory is None and (peak is not None or rss is not None or breakdown is not None or breakdown_skipped):
        memory = MemoryResult(peak_bytes=peak, peak_source="tensor tracker (RSS beside it)",
                              peak_reserved_bytes=None, peak_rss_bytes=rss, breakdown=breakdown,
                              breakdown_skipped=breakdown_skipped)
    if parity_result is None and label != "baseline" and kind != "algorithmic":
        parity_result = parity(kind, tol=(5e-2, 2e-2) if kind == "numeric" else (1e-3, 1e-3))
    return TrialRecord(**head, build=build, speed=speed, quality=quality, parity=parity_result, memory=memory,
                       technique_results=technique_results or {})
