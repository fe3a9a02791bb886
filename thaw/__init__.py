"""thaw: a serverless-style edge autoscaler. This package is the composition root — the
CLI and its commands, `thaw up`, image builds, the load-test runner — and imports
everything; the services import the shared ground (`ground/`), never this."""

__version__ = "0.1.0"
