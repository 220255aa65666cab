"""Routing for `collection.router` models: a request naming one is sent to one of its candidates.

Pure parts only (no server imports), so the engine can be tested as a table of policy + request ->
decision: `policy.py` validates a policy document, `context.py` reads a request body into what
conditions look at, `evaluate.py` decides. The HTTP edge that uses them is `api/openai/routing.py`.
"""
