"""AgentKV: a lifecycle-aware KV-cache service for agentic LLM inference."""

__version__ = "0.1.0"
