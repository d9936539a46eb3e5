"""Knowledge distillation: the workload's model learns from a larger teacher of the same family as well as the labels.

Method card
- What: the loss of every step is (Hinton, Vinyals, Dean 2015)

      alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * base_loss

  with ``s`` the student's logits (the trial's model), ``t`` the teacher's on the same batch, ``T`` the
  ``temperature`` and ``base_loss`` the workload's own loss against the labels. The KL divergence is the mean over
  positions (``batchmean`` over the flattened positions: a GPT's (B, T, V) logits are B*T rows of V, a classifier's
  (B, C) are B rows), computed in float32 whatever the autocast. The ``T^2`` factor keeps the soft targets'
  gradients the same size as T changes (at high T the gradient of ``T^2 * KL`` on a logit tends to
  ``(s_i - t_i) / C`` per row, Hinton et al. eq. 3), so ``alpha`` weighs the two terms the same at any T.
- The teacher, as the model's description (``bench.core.structure``) says, never by the workload's name: another size of
  the same build (``teacher_size``, which a user's build may return: the teacher is ``build(size=teacher_size)``;
  ``width`` and ``depth`` are then unused), or the same build scaled up (``scaling``: ``teacher_params``): the
  declared width keys x ``width`` (a key that must stay a multiple of another, such as the width of whole heads,
  rounded to it), the depth keys x ``depth``. Declared: gpt ``d_model`` (a multiple of ``n_head``) and ``n_layer``;
  cnn and cnn_aug every stage's ``widths`` and ``blocks_per_stage``; mlp ``width`` and ``depth``; Hugging Face
  GPT-2 ``n_embd`` (a multiple of ``n_head``) and ``n_layer``, Llama ``hidden_size`` (a multiple of
  ``num_attention_heads``), ``intermediate_size`` and ``num_hidden_layers``. A model with neither is skipped:
  "distill: needs a teacher: return teacher_size from build, or declare width/depth scaling". It is built from a fixed seed (``TEACHER_SEED``, 20000), trained with the harness's plain loop
  (AdamW at the size's LR and batch, the batch order of the same fixed seed) for ``teacher_steps`` x the quality
  budget's samples (the sweep's: ``--steps`` when given, else the size's; the report's line and caveat state it),
  evaluated once on the workload's held-out set (``teacher_eval`` in the record: a distilled
  student can only be judged next to its teacher), and cached in the sweep's reference directory as
  ``teacher-<key>.pt``, the key a hash of the workload, the teacher's parameters, the dataset's sha256, its steps,
  batch, LR, seed and the scale factors. One teacher serves every trial and every seed of a sweep. Nothing is
  downloaded.
- In training the teacher sits beside the model on the trial's device in eval mode with ``requires_grad`` off: it is
  not part of the model, gets no gradient and is not in the optimizer. Its logits are computed online, every step,
  under ``no_grad``: each step pays a teacher forward on top of the student's forward and backward. They are not
  precomputed: that needs a fixed data order (the logits of example i at its augmentation of epoch e), while the
  trial's batch order follows its seed, ``cnn_aug`` augments each sample afresh, a curriculum reorders or cuts the
  batches, and Beyer et al. 2022 find that the teacher should see exactly the student's view of each example.
- When it helps: when a model of the student's size is what you must ship (latency, memory at inference) and a
  larger model can be trained once. Distillation then buys quality at a fixed student size, or the same quality
  from a smaller student: DistilBERT kept 97% of BERT-base's GLUE score with 40% fewer parameters and ran 60%
  faster at inference. It does not make a training step faster: the student here is the workload's model, so the
  interesting measurements are the final metric and the time to target at equal samples, against the baseline.
  ``alpha=0`` is the control: the same step cost (the teacher still runs), the plain loss.
- Costs: (1) the teacher's training, once per sweep and key. It is reported as ``teacher_train_s`` (its training
  and its one evaluation, kept in the cache so a cache hit still reports it) and is not charged to the trial's
  one-off cost (``probe_s``): a user who trains N students from one teacher pays ``teacher_train_s / N`` per
  student, and the report amortises it over the trials that share the key. (2) Every step runs the teacher's
  forward: the step time includes it, and since FLOPs per step are counted on the trial's own loop
  (``own_flops``), they include it too, so the MFU counts the teacher's forward as useful work. (3) Memory: the
  teacher's weights and, during its forward, its activations (no gradients, no optimizer state).
- CPU vs GPU: on a CPU the teacher's forward (up to ``width^2 x depth`` x the student's forward FLOPs: hidden
  matmuls grow with width squared, the input and output layers with width) adds its full time to every step, and
  training the teacher once takes ``teacher_steps`` x the baseline's quality run times the teacher's relative
  cost. On a GPU a small student rarely fills the device, so
  the teacher's forward costs less than its FLOPs suggest; the published gains are inference-time gains of the
  smaller student (DistilBERT's 60%), not training-time ones.
- Not implemented: intermediate-layer (hint) losses (FitNets, DistilBERT's cosine loss on hidden states), a
  pretrained or downloaded teacher, precomputed teacher logits, teachers of another family, more than one process
  (each rank would train and write the teacher), a user's model with neither a ``teacher_size`` nor ``scaling``
  (its build's size parameters are opaque to the harness).
- Measured (AMD EPYC (AVX2 only); tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques):
  the teacher's forward every step cost samples/s on gpt (0.57x [0.45, 0.73] slower); on cnn (0.75x [0.54, 1.03])
  and mlp (0.48x [0.19, 1.24]) inconclusive; memory 1.55x, 1.74x, 1.78x (more: its weights are in the breakdown).
  At equal samples cnn's accuracy difference, +0.036 [+0.015, +0.058] (teacher 0.801 against the baseline student's
  0.718), is inconclusive (p = 0.019 alone, not after Holm's correction over the report's 8 comparisons); gpt (+0.13
  val_loss [-0.25, +0.51]) and mlp (-0.000 [-0.054, +0.054]) inconclusive. At equal time no gain was shown: gpt
  +0.48 [+0.03, +0.94] val_loss (inconclusive after Holm), mlp -0.111 [-0.229, +0.006], cnn -0.000
  [-0.026, +0.025], all inconclusive. The teachers (twice the width) trained once in 15.7 s (gpt), 8.8 s (cnn) and 3.5 s
  (mlp).
- Sources: Hinton, Vinyals, Dean, "Distilling the Knowledge in a Neural Network", 2015 (arXiv:1503.02531); Beyer,
  Zhai, Royer, Markeeva, Anil, Kolesnikov, "Knowledge distillation: A good teacher is patient and consistent",
  CVPR 2022 (arXiv:2106.05237); Sanh, Debut, Chaumond, Wolf, "DistilBERT, a distilled version of BERT: smaller,
  faster, cheaper and lighter", 2019 (arXiv:1910.01108); PyTorch ``torch.nn.functional.kl_div`` (``log_target``,
  ``reduction="batchmean"``).
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

