"""radixtop: watch an LLM server's prefix cache misbehave, and prove why."""

__version__ = "0.1.0"
