"""trainbench: measure training-acceleration techniques side by side."""

__version__ = "0.1.0"
