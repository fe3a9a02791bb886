"""thaw: a serverless-style edge autoscaler (CLI, registry port, shared wiring)."""

__version__ = "0.1.0"
