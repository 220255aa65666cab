"""What routing conditions look at in a request body: its text, its features and its metadata.

The text is the last user turn of a chat (`messages`), or the `prompt` of a text completion (an
array's strings joined by newlines), or the Responses API `input` (its last user item; without a
role-tagged user item, every role-less item joined). Its length is counted in UTF-8 bytes.
`has_images` looks at every turn, not only the last one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TEXT_PARTS = ("text", "input_text")
IMAGE_PARTS = ("image_url", "input_image")


@dataclass(frozen=True)
class RouteContext:
    text: str = ""
    has_tools: bool = False
    has_images: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def chars(self) -> int:
        """The length conditions compare: UTF-8 bytes (the schema's unit, not code points)."""
        return len(self.text.encode("utf-8", errors="surrogatepass"))

    def describe(self) -> dict[str, Any]:
        """The request as an `llm` classifier is shown it."""
        return {"text": self.text, "has_tools": self.has_tools, "has_images": self.has_images,
                "chars": self.chars, "metadata": dict(self.metadata)}


def content_text(content: Any) -> str:
    """The text of a message `content`: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(p["text"] for p in content if isinstance(p, Mapping) and p.get("type") in TEXT_PARTS
                     and isinstance(p.get("text"), str))


def content_has_image(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PARTS
                                             for p in content)


def _last_user(items: list[Any]) -> str | None:
    for item in reversed(items):
        if isinstance(item, Mapping) and item.get("role") == "user" and "content" in item:
            return content_text(item["content"])
    return None


def route_context(body: Mapping[str, Any]) -> RouteContext:
    """Read a chat, completion or Responses request body (as the client sent it)."""
    text = ""
    images = False
    messages, prompt, given = body.get("messages"), body.get("prompt"), body.get("input")
    if isinstance(messages, list):
        images = any(isinstance(m, Mapping) and content_has_image(m.get("content")) for m in messages)
        text = _last_user(messages) or ""
    elif "prompt" in body:
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list):
            text = "\n".join(p for p in prompt if isinstance(p, str))
    elif isinstance(given, str):
        text = given
    elif isinstance(given, list):
        images = any(isinstance(item, Mapping) and content_has_image(item.get("content", [item])) for item in given)
        user = _last_user(given)
        if user is not None:
            text = user
        else:  # role-less items: plain strings and bare content parts, in order
            pieces = [item if isinstance(item, str) else
                      content_text(item.get("content", [item])) if isinstance(item, Mapping) and "role" not in item
                      else "" for item in given]
            text = "\n".join(p for p in pieces if p)
    tools = body.get("tools")
    raw_meta = body.get("metadata")
    metadata = ({str(k): v for k, v in raw_meta.items() if isinstance(v, str)}
                if isinstance(raw_meta, Mapping) else {})
    return RouteContext(text=text, has_tools=isinstance(tools, list) and bool(tools), has_images=images,
                        metadata=metadata)


def conversation_key(body: Mapping[str, Any]) -> str:
    """Which conversation a request belongs to, for `routing_switches_total`: a hash of its first
    system message and first user message (later turns of one conversation share them)."""
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    if isinstance(items, list):
        def first(role: str) -> Any:
            return next((m.get("content") for m in items if isinstance(m, Mapping) and m.get("role") == role), None)
        key: Any = [first("system"), first("user")]
    else:
        key = [None, body.get("prompt")]
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
