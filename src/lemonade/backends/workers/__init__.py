"""Worker processes of ours for Python-native engines.

Each worker is a standalone script run with its engine's private venv Python (so it may import
only the standard library and the engine's own packages, never `lemonade`). It serves one model
over HTTP on a loopback port: `GET /health` (200 once the model is loaded) and its endpoints.
"""
