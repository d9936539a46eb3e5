"""Knowledge distillation: the workload's model learns from a larger teacher of the same family as well as the labels.

Method card
- What: each step's loss is ``alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * base_loss`` (Hinton,
  Vinyals, Dean 2015), ``s`` the student's logits (the trial's model), ``t`` the teacher's on the same batch, ``T`` the
  ``temperature``, the KL in float32 as a mean over positions. The teacher is the same build at another size (a
  user's build returns ``teacher_size``) or scaled up through the model's description (its width keys x ``width``,
  its depth keys x ``depth``). It is trained once per sweep from a fixed seed for ``teacher_steps`` x the quality
  budget's samples, evaluated once (``teacher_eval`` in the record) and cached beside the sweep's references; nothing
  is downloaded. Its forward runs online every step under ``no_grad`` (not precomputed: the batch order follows the
  trial's seed and augmentation draws afresh). Kind algorithmic.
- When it should pay: never in step time. Each step adds the teacher's forward, up to ``width^2 x depth`` times the
  student's forward FLOPs, and memory for its weights and activations; on a GPU a small student leaves the device
  launch-bound, so the teacher's forward may cost less than its FLOPs suggest (not measured). What it buys is
  quality at a fixed student size, which matters when the student's size is what ships: read quality at equal
  samples and time to target against the baseline. ``alpha=0`` is the control: the same step cost, the plain loss.
- Options: ``alpha`` (0.5), ``temperature`` (2.0), ``width`` (2.0), ``depth`` (1), ``teacher_steps`` (2.0). The
  teacher's training is reported as ``teacher_train_s``, not charged to the trial's one-off cost (N students of one
  teacher each pay a share). Refused with ``mtp``, with several processes (each rank would train the teacher), for a
  model that computes its own loss in its forward, and for one with neither ``teacher_size`` nor declared scaling.
  Not implemented: hidden-state (hint) losses, a pretrained teacher, precomputed logits.
- Sources: Hinton, Vinyals, Dean, "Distilling the Knowledge in a Neural Network", arXiv:1503.02531; Beyer et al.,
  "Knowledge distillation: A good teacher is patient and consistent", CVPR 2022 (arXiv:2106.05237: the teacher
  should see the student's view of each example); Sanh et al., DistilBERT, arXiv:1910.01108 (published: 97% of
  BERT-base's GLUE score with 40% fewer parameters, 60% faster at inference).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-distill (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny 0.75x [0.54, 1.03] inconclusive, memory 1.74x more.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny 0.57x [0.45, 0.73] slower, memory 1.55x more.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/mlp`: mlp:tiny 0.48x [0.19, 1.24] inconclusive, memory 1.78x more.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-user-models-structure`: lstm_lm:small, small_resnet:small, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.files import save_torch_atomic
from bench.core.structure import ModelStructure, describe
from bench.workloads.base import get as get_workload  # the registry: a teacher is another build of it
from techniques._model import module_tensors, n_params, once
from techniques.base import (
    Context,
    Kind,
    Phase,
    Probe,
    Technique,
    TrainConfig,
    logits_of,
    own_loss_problem,
    register,
)

TEACHER_SEED = 20_000  # the teacher's initialisation and batch order: one teacher per key, whatever the trial seed
NO_TEACHER = ("needs a teacher: return teacher_size from build, or declare width/depth scaling in the "
              "structure it returns (docs/models.md)")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, base_loss: torch.Tensor,
                      alpha: float, temperature: float) -> torch.Tensor:
    """``alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * base_loss``, the KL averaged over positions
    (the logits' last dimension is the classes; every leading dimension is flattened into positions), in float32."""
    n_classes = student_logits.shape[-1]
    s = student_logits.float().reshape(-1, n_classes) / temperature
    t = teacher_logits.float().reshape(-1, n_classes) / temperature
    kl = F.kl_div(F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1), log_target=True, reduction="batchmean")
    return alpha * temperature**2 * kl + (1 - alpha) * base_loss


def teacher_params(structure: ModelStructure, params: dict[str, Any], width: float, depth: int) -> dict[str, Any]:
    """A size's parameters scaled to the teacher's as the model's description says (``structure.scaling``): the
    width keys x ``width`` (whole heads where a key must stay a multiple of another), the depth keys x ``depth``;
    data, batch, LR and budget unchanged."""
    if structure.scaling is None:
        raise ValueError(f"distill: {NO_TEACHER}")
    return structure.scaling.apply(params, width, depth)


@register
class Distill(Technique):
    name = "distill"
    summary = "knowledge distillation from a wider/deeper teacher of the same family, trained once and cached"
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "distill"
    conflicts = frozenset({"mtp"})  # both rewrite the loss: the KD mix would scale the extra heads' losses too
    own_flops = True  # every step runs the teacher's forward
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        alpha: float = 0.5  # weight of the soft-target term (0: the plain loss, teacher still run: the control)
        temperature: float = 2.0  # softmax temperature of both sides of the KL term
        width: float = 2.0  # the teacher's width factor
        depth: int = 1  # the teacher's depth factor
        teacher_steps: float = 2.0  # the teacher trains this multiple of the quality budget's samples (the
        # sweep's: --steps when given, else the size's), at its own batch; the report states what it trained

        def __post_init__(self) -> None:
            if not 0.0 <= self.alpha <= 1.0:
                raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
            if not (math.isfinite(self.temperature) and self.temperature > 0):
                raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
            if not (math.isfinite(self.width) and self.width >= 1):
                raise ValueError(f"width must be a finite number >= 1 (the teacher's width factor), got {self.width}")
            if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 1:
                raise ValueError(f"depth must be an integer >= 1 (the teacher's depth factor), got {self.depth!r}")
            if not (math.isfinite(self.teacher_steps) and self.teacher_steps > 0):
                raise ValueError(f"teacher_steps must be a finite number > 0 (a multiple of the quality budget), "
                                 f"got {self.teacher_steps}")

    def check(self, ctx: Context) -> str | None:
        s = ctx.structure
        if s is not None and not (s.scaling or s.teacher_size):  # None: a device-level listing, no refusal
            return NO_TEACHER
        if ctx.world_size > 1:
            return "runs on one process: each rank would train and write the teacher"
        own = own_loss_problem(ctx, "mixes the student's logits with the teacher's into its loss")
        if own:
            return own
        return None

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        reason = self.check(ctx)
        if reason is not None:
            raise ValueError(reason)
        self._teacher, self._meta = load_or_train_teacher(ctx.workload, probe, ctx, self.options)
        return cfg

    def loss(self, out: Any, batch: Any, base_loss: torch.Tensor, ctx: Context) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = self._teacher(batch[0])
        return distillation_loss(logits_of(out), teacher_logits, base_loss, self.options.alpha,
                                 self.options.temperature)

    def held_parts(self, ctx: Context) -> dict[str, list[torch.Tensor]]:
        teacher = getattr(self, "_teacher", None)
        return {"teacher": module_tensors(teacher)} if teacher is not None else {}

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The report's line of what the technique found (the shared ``summarize`` interface): the teacher (a size
        of the build or a scaled copy), its metric, what training it cost per trial."""
        first = found[0]
        metric = (first.get("teacher_eval") or {}).get(first.get("teacher_metric") or "")
        shape = first.get("teacher_shape") or {}
        what = (f"size {shape['size']}" if "size" in shape else
                f"{first.get('width')}x width, {first.get('depth')}x depth")
        n_teacher, n_student = first.get("teacher_n_params"), first.get("student_n_params")
        return (f"teacher {n_teacher:,} params ({what}; student {n_student:,}), " if n_teacher and n_student else
                f"teacher ({what}), ") + (
            f"{first.get('teacher_metric')} {metric:.3g} after " if isinstance(metric, float) else "after ") + (
            f"{first.get('teacher_steps_trained')} steps" + _teacher_budget(first) + ", " +
            once(found, "teacher_train_s", "trained") + f"; alpha {first.get('alpha')}, T {first.get('temperature')}")

    @classmethod
    def caveat(cls, found: list[dict[str, Any]]) -> str | None:
        """What the set's numbers leave out: the teacher's own training, longer than the students' and outside the
        trial's clock (the option that sets it named)."""
        first = next((f for f in found if f and f.get("teacher_steps_trained")), None)
        if first is None:
            return None
        return (f"its teacher trained {first['teacher_steps_trained']:,} steps{_teacher_budget(first)} once per "
                "sweep, outside every trial's clock (distill:teacher_steps sets it)")

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        out: dict[str, Any] = {"alpha": o.alpha, "temperature": o.temperature, "width": o.width, "depth": o.depth,
                               "teacher_steps": o.teacher_steps}
        if hasattr(self, "_meta"):
            out.update(self._meta)
        return out


def _teacher_budget(found: dict[str, Any]) -> str:
    """`` (2x the quality budget of 7,680 samples)``: how the teacher's steps were set, where the record says."""
    multiple, budget = found.get("teacher_steps"), found.get("teacher_budget_samples")
    return f" ({multiple:g}x the quality budget of {budget:,} samples)" if multiple and budget else ""


def load_or_train_teacher(workload_name: str, probe: Probe, ctx: Context, options: Distill.Options
                          ) -> tuple[nn.Module, dict[str, Any]]:
    """The teacher (on ``probe.device``, eval mode, frozen) and what it is: from ``ctx.cache_dir`` when it holds this
    key, else trained now (its time goes to ``probe.shared_s``) and saved there when there is a cache."""
    student = probe.fresh(TEACHER_SEED)  # the size's parameters and the student's parameter count
    s = ctx.structure or student.structure or describe(student.model)
    student_n = n_params(student.model)
    wl = get_workload(workload_name)
    if s.teacher_size is not None:  # another size of the same build
        tparams: dict[str, Any] = {"size": s.teacher_size}
        shape = dict(tparams)
        del student
        built = wl.build(s.teacher_size, TEACHER_SEED, probe.device)
    else:
        tparams = teacher_params(s, student.params, options.width, options.depth)
        scaling = s.scaling
        shape = {k: tparams[k] for k in (*scaling.width, *scaling.depth, *(b for _, b in scaling.multiple_of))}
        del student
        built = wl.build_from(tparams, TEACHER_SEED, probe.device)
    # The sweep's quality budget (--steps, or the size's) in samples: the teacher follows what the students train.
    budget = ctx.total_samples or built.quality_steps * built.batch_size
    if budget <= 0:
        raise ValueError("distill sizes the teacher's training by the quality budget, and this run has none: give "
                         "--steps")
    steps = math.ceil(options.teacher_steps * budget / built.batch_size)
    key = hashlib.sha256(json.dumps(
        {"workload": workload_name, "params": tparams, "dataset": built.dataset.get("sha256"), "steps": steps,
         "batch": built.batch_size, "lr": built.lr, "seed": TEACHER_SEED, "width": options.width,
         "depth": options.depth, "teacher_steps": options.teacher_steps},
        sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = ctx.cache_dir / f"teacher-{key}.pt" if ctx.cache_dir else None
    teacher = built.model
    if path is not None and path.exists():
        saved = torch.load(path, map_location=probe.device, weights_only=True)
        teacher.load_state_dict(saved["state"])
        meta, cached = json.loads(saved["meta"]), True
    else:
        started = time.perf_counter()
        loop = probe.loop(built, built.lr)
        batches = built.batches(built.batch_size, TEACHER_SEED)
        for _ in range(steps):
            loop.step(next(batches))
        teacher.eval()
        with torch.no_grad():
            evaluated = built.evaluate(teacher)
        elapsed = time.perf_counter() - started
        probe.shared_s += elapsed  # paid once for the sweep: not this trial's one-off cost
        meta = {"key": key, "teacher_train_s": round(elapsed, 3), "teacher_n_params": n_params(teacher),
                "teacher_steps_trained": steps, "teacher_budget_samples": budget,
                "teacher_batch_size": built.batch_size, "teacher_lr": built.lr,
                "teacher_seed": TEACHER_SEED, "teacher_metric": built.metric,
                "teacher_eval": {k: round(float(v), 6) for k, v in evaluated.items()},
                "teacher_shape": shape}
        cached = False
        if path is not None:
            state = {k: v.detach().cpu() for k, v in teacher.state_dict().items()}
            save_torch_atomic(path, {"state": state, "meta": json.dumps(meta)})
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher, {**meta, "cached": cached, "student_n_params": student_n}

