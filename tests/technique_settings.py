"""Test settings for every registered technique: a technique added without an entry here fails the
registry-wide test (as composer's algorithm_settings does), so nothing ships untested."""

from __future__ import annotations

# technique name -> (spec label used in tests, workload it is exercised on)
TECHNIQUE_SETTINGS: dict[str, tuple[str, str]] = {
    "baseline": ("baseline", "mlp"),
    "bf16": ("bf16", "gpt"),
    "fp16": ("fp16", "mlp"),
    "grad_accum": ("grad_accum:steps=2", "gpt"),
    "checkpointing": ("checkpointing", "gpt"),
    "compile": ("compile", "mlp"),
    "tf32": ("tf32", "gpt"),
    "fused_adamw": ("fused_adamw", "gpt"),
    "lr_schedule": ("lr_schedule:schedule=one_cycle", "gpt"),
    "lr_finder": ("lr_finder:steps=20", "mlp"),
    "early_stopping": ("early_stopping:patience=2", "mlp"),
    "curriculum": ("curriculum", "gpt"),
    "batch_size": ("batch_size:mode=noise:noise_repeats=2:warmup_steps=5", "mlp"),
    "loader": ("loader:workers=2", "cnn_aug"),
    "channels_last": ("channels_last", "cnn"),
    "sdpa_backend": ("sdpa_backend:backend=math", "gpt"),
    "distill": ("distill:teacher_steps=0.05", "mlp"),
    "transfer": ("transfer:steps=0.02", "gpt"),
    "freeze": ("freeze:blocks=1", "gpt"),
    "prune": ("prune:start=0:end=0", "gpt"),  # pruned before the first step (the default starts at 25% of the plan)
    "qat": ("qat", "mlp"),  # optional extra trainbench[torchao]: skipped with the reason without it
    "efficient_arch": ("efficient_arch", "gpt"),
    "mtp": ("mtp", "gpt"),
    "dpo": ("dpo", "pref"),
    "grpo": ("grpo", "pref"),
    "rloo": ("rloo", "pref"),
    "best_of_n": ("best_of_n", "pref"),
}

# Techniques whose check() refuses anything but a CUDA GPU (their own test files run them there): name -> (set,
# workload). On CPU the registry test says why it skips.
GPU_SETTINGS: dict[str, tuple[str, str]] = {
    "fp8": ("bf16+fp8", "gpt"),
    "sparse24": ("bf16+sparse24:layers=all", "mlp"),
}

# Multi-process techniques run under torchrun with 2 gloo ranks (tests/dist_worker.py): name -> (set, workload).
DISTRIBUTED_SETTINGS: dict[str, tuple[str, str]] = {
    "ddp": ("ddp", "mlp"),
    "zero1": ("zero1", "mlp"),
    "zero2": ("zero2", "mlp"),
    "zero3": ("zero3", "mlp"),
    "offload": ("zero3+offload", "mlp"),
    "deepspeed": ("deepspeed", "mlp"),
    "local_sgd": ("local_sgd:period=2:warmup=1", "mlp"),
    "fedavg": ("fedavg:clients=2:local_steps=1", "mlp"),
    "tp": ("tp", "gpt"),
    "pp": ("pp:microbatches=2", "gpt"),
}
