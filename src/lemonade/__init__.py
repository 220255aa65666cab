"""Lemonade in Python: a local AI server with OpenAI, Ollama, Anthropic and MCP APIs."""

__version__ = "0.1.0"
