"""A local stand-in for the Hugging Face Hub (and ModelScope) used by the tests.

- ``tests.hub.server``        -- the HTTP server (thread or ``python -m tests.hub.server``); its
  routes are split by concern (``repos``, ``state``, ``handler``, ``files``, ``hf_api``,
  ``modelscope``, ``admin``)
- ``tests.hub.fixtures``      -- builds the fixture repos (real Gemma GGUF + tiny generated GGUFs)
- ``tests.hub.pytest_plugin`` -- ``hub_server`` (session) and ``hub`` (per test, state reset) fixtures

See ``tests/hub/README.md`` for the contract, the admin controls and how to point
``huggingface_hub`` at the server.
"""
