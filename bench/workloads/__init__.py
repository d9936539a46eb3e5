"""Reference workloads. Importing this package registers them: mlp (MNIST-1D), gpt (characters), cnn (Fashion-MNIST),
cnn_aug (cnn with a CPU-heavy per-sample augmentation), hf (Hugging Face causal LMs from a config, optional extra), llama
(a built-in Llama-style decoder on the gpt characters), pref (preference learning on the gpt model)."""

from bench.workloads import (  # noqa: F401  (registers them)
    cnn_aug,
    cnn_fashion,
    gpt_chars,
    hf_causal,
    llama_chars,
    mlp_mnist1d,
    pref,
)
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
