"""Chat through the router, for every entry point: OpenAI's chat route, Anthropic's Messages, MCP's
`lemonade_chat`, the omni loop and the job op `chat`.

`chat_model` is the one check of the model a chat names; `auto_load` takes the load-level fields a
request may carry (they shape the load it triggers and never reach the engine); `forcing` and
`answer` carry out a named `tool_choice` (runtime/forced_call.py): the body to send and the
non-streamed answer made the call. How an answer is sent back (a relayed stream, a JSON response,
an Anthropic message, a tool result) is each API's own.
"""

from __future__ import annotations

from typing import Any

from lemonade.model_info import ModelInfo
from lemonade.runtime import forced_call
from lemonade.services import Services
from lemonade.serving.load import load_for_request
from lemonade.serving.models import check_model, resolve

CHAT_PATH = "/v1/chat/completions"  # the engine's path (llama-server's, and every OpenAI-compatible engine's)
ENDPOINT = "chat/completions"  # the endpoint stats, metrics and spans count it under
# Load-level fields an inference body may carry (Lemonade's allow-list): they shape the load the
# request triggers, are not sent to the engine, and are never saved.
AUTO_LOAD_FIELDS = ("ctx_size",)


def chat_model(svc: Services, name: str, endpoint: str, images: bool = False) -> ModelInfo:
    """The chat model `name` names, checked to serve `endpoint` (with images when the messages hold some)."""
    return check_model(svc, resolve(svc, name), "chat", endpoint, images=images)


async def auto_load(svc: Services, model: ModelInfo, payload: dict[str, Any]) -> None:
    """Load `model` for this request if it is not loaded, with the load-level fields `payload` carries
    (taken out of it)."""
    request = {k: payload.pop(k) for k in AUTO_LOAD_FIELDS if k in payload}
    await load_for_request(svc, model, request)


def forcing(payload: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the body to send, the tool a named `tool_choice` forces or None). A choice naming no offered
    tool is a 400."""
    name = forced_call.named_tool(payload)
    return (forced_call.forced(payload, name) if name is not None else payload), name


async def answer(svc: Services, model: ModelInfo, sent: dict[str, Any], forced: str | None) -> dict[str, Any]:
    """A non-streamed chat completion of `sent` (from `forcing`) through the proxy; with a forced tool,
    the answer made its call."""
    data = await svc.proxy.post_json(model, CHAT_PATH, sent, ENDPOINT)
    return forced_call.as_call(data, forced) if forced is not None else data
