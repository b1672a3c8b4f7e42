"""benchbatch: measure why LLM inference is served in batches, on your own hardware."""

__version__ = "0.1.0"
