"""The use cases every entry point shares (docs/architecture.md, "Layers"): below `api/`, above `services.py`.

A module here takes plain values (names, dicts, `ModelInfo`), raises `APIError`, and knows nothing of
HTTP: the OpenAI, Ollama, Anthropic and MCP routes, the job ops, the omni loop and the peers all call
it, so no API family borrows another family's route module for what it does.
"""
