"""DDTree speculative decoding for SGLang 0.5.17, shipped as a plugin (no fork)."""

__version__ = "0.1.0"
