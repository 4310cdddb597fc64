"""metering: billing, metering and usage reporting for an LLM inference API."""

__version__ = "0.1.0"
