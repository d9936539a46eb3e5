"""Reference workloads. Importing this package registers them: mlp (MNIST-1D), gpt (characters), cnn (Fashion-MNIST),
hf (Hugging Face causal LMs from a config, optional extra)."""

from bench.workloads import cnn_fashion, gpt_chars, hf_causal, mlp_mnist1d  # noqa: F401  (registers the workloads)
from bench.workloads.base import BuiltWorkload, Workload, WorkloadError, get, register, registry

__all__ = ["BuiltWorkload", "Workload", "WorkloadError", "get", "register", "registry"]
