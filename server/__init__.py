"""The polyhead gateway: OpenAI-compatible API, admin API, metrics, settings and CLI."""
