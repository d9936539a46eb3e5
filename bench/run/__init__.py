"""The parent side of the process boundary: runner, executors, launcher, sequential phases, A/B, tune's search, profile."""
