"""`json.loads` for text from outside (clients, WebSocket messages, model output).

Why: Python's parser recurses once per nesting level, so `[[[[...]]]]` a few thousand deep raises
RecursionError, which no `except ValueError` catches and which reached clients as a 500. Here it
is the ValueError every caller already turns into a 4xx (or a JSON-RPC parse error).
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON is nested too deeply") from None
