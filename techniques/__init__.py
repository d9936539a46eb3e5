"""Training-acceleration techniques. Importing this package registers every built-in technique.

The import list is explicit on purpose: a technique exists when it is listed here, and a duplicate name fails.
"""

from techniques import (  # noqa: F401  (imported for registration)
    baseline,
    batch_size,
    best_of_n,
    bf16,
    channels_last,
    checkpointing,
    compile,
    curriculum,
    ddp,
    deepspeed,
    distill,
    dpo,
    early_stopping,
    efficient_arch,
    fedavg,
    fp8,
    fp16,
    freeze,
    fused_adamw,
    grad_accum,
    grpo,
    loader,
    local_sgd,
    lr_finder,
    lr_schedule,
    mtp,
    offload,
    pp,
    prune,
    qat,
    rloo,
    sdpa_backend,
    sparse24,
    tf32,
    tp,
    transfer,
    zero1,
    zero2,
    zero3,
)
from techniques.base import Context, Kind, OptionError, Phase, Technique, TrainConfig, get, register, registry

__all__ = ["Context", "Kind", "OptionError", "Phase", "Technique", "TrainConfig", "get", "register", "registry"]
