"""Which tools one omni collection offers, and on which of its components each runs.

The collection's LLM is its first component that deploys as `chat`. A built-in tool is offered only
when a component can run it (openai.md "Server-side tools", custom-models.md's role table; the
tool's runner in `media.RUNNERS` decides): an `image` model for `generate_image`, one labelled `edit`
for `edit_image`, a `tts` model for `text_to_speech`, a `transcription` model for `transcribe_audio`,
a chat model with vision for `analyze_image`, each with an engine this server has. `analyze_image`
is for an LLM that cannot see: one that can gets the user's pictures in its own messages instead.
The tools of the MCP servers this server is connected to (`/internal/mcp`, mcp_client/) follow,
named `mcp_<server>__<tool>`. The client's own tools are added after ours; a client tool named like
one of ours is dropped (ours run on the server, theirs never would).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.omni.definitions import OMNI_TOOLS, PLACEHOLDERS, SYSTEM_PROMPT
from lemonade.omni.media import RUNNERS
from lemonade.services import Services
from lemonade.serving.models import accepts_images


@dataclass
class Toolset:
    collection: ModelInfo
    llm: ModelInfo
    system_prompt: str
    tools: list[dict[str, Any]]                     # OpenAI `tools`: ours, the MCP servers', then the client's
    runs_on: dict[str, ModelInfo] = field(default_factory=dict)  # our tool name -> the component it runs on
    mcp: dict[str, tuple[str, str]] = field(default_factory=dict)  # MCP tool name -> (server id, its tool)

    def is_server_tool(self, name: str | None) -> bool:
        return name in self.runs_on or name in self.mcp


def components(svc: Services, collection: ModelInfo) -> list[ModelInfo]:
    """The collection's registered components, in order (a deleted one is skipped)."""
    found = [svc.catalog.find(name) for name in collection.components or []]
    return [m for m in found if m is not None and not m.is_collection]


def build(svc: Services, collection: ModelInfo, client_tools: list[dict[str, Any]] | None) -> Toolset:
    """The toolset of `collection` for one request; 400 when it has no LLM to drive the loop."""
    parts = components(svc, collection)
    llm = next((m for m in parts if m.mode == "chat"), None)
    if llm is None:
        raise APIError(400, f"Model {collection.public} is an omni collection without a chat model among its "
                       f"components ({', '.join(collection.components or [])}); add an LLM to it to chat with it",
                       code="model_mode_mismatch")
    if not svc.engines.available(llm.recipe):
        raise APIError(400, f"Model {collection.public}: its chat component {llm.public} uses recipe '{llm.recipe}', "
                       "whose engine is not available in this server.", code="model_load_refused")
    tools: list[dict[str, Any]] = []
    runs_on: dict[str, ModelInfo] = {}
    lines: list[str] = []
    guidance: list[str] = []
    llm_sees = accepts_images(svc, llm)
    for definition in OMNI_TOOLS:
        runner = RUNNERS.get(definition["function"]["name"])
        if runner is None or (llm_sees and definition["function"]["name"] == "analyze_image"):
            continue
        component = next((m for m in parts if runner.serves(svc, m)), None)
        if component is None:
            continue  # no component can run it (or this server cannot run the tool at all)
        function = copy.deepcopy(definition["function"])
        tools.append({"type": "function", "function": function})
        runs_on[function["name"]] = component
        lines.append(f"- {function['name']}: {function['description']}")
        if definition.get("guidance"):
            guidance.append(definition["guidance"])
    mcp: dict[str, tuple[str, str]] = {}
    for listed in svc.mcp.tools():  # the connected MCP servers' tools run here too (mcp_client/)
        function = listed["openai_tool"]["function"]
        tools.append(listed["openai_tool"])
        mcp[function["name"]] = (listed["server_id"], listed["name"])
        lines.append(f"- {function['name']}: {function['description']}")
    for tool in client_tools or []:
        name = (tool.get("function") or {}).get("name")
        if name not in runs_on and name not in mcp:
            tools.append(tool)
    template = collection.definition.get("system_prompt")
    if not isinstance(template, str) or not all(p in template for p in PLACEHOLDERS):
        template = SYSTEM_PROMPT
    prompt = template.replace("{tool_list}", "\n".join(lines) or "(none)").replace(
        "{tool_guidance}", "".join("\n" + g for g in guidance))
    return Toolset(collection=collection, llm=llm, system_prompt=prompt, tools=tools, runs_on=runs_on, mcp=mcp)
