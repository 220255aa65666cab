"""Omni collections: the server-side tool loop behind chat completions (and MCP `lemonade_omni`)
that name a `collection.omni` model. `definitions` holds the built-in prompt and tools, `toolset`
fits them to one collection's components, `media` runs the tools on those components, and `loop`
drives the collection's LLM through the rounds."""
