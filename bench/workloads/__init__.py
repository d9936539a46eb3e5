"""Reference workloads. Importing this package registers them: mlp (MNIST-1D), gpt (characters), cnn (Fashion-MNIST),
cnn_aug (cnn with a CPU-heavy per-sample augmentation), hf (Hugging Face causal LMs from a config, optional extra), pref (preference learning on the gpt model)."""

from bench.workloads import cnn_aug, cnn_fashion, gpt_chars, hf_causal, mlp_mnist1d, pref  # noqa: F401  (registers them)
from bench.workloads.base import (
    BuiltWorkload,
    SourceTask,
    Workload,
    WorkloadError,
    artefact_dir,
    get,
    register,
    registry,
    use_artefact_dir,
)

__all__ = ["BuiltWorkload", "SourceTask", "Workload", "WorkloadError", "artefact_dir", "get", "register", "registry",
           "use_artefact_dir"]
