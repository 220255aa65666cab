"""The MCP tools: their JSON Schemas (for `tools/list`) and what each call does.

Every tool goes through the same router and proxy as the HTTP APIs (auto-load, download, stats).
A tool failure (bad arguments, unknown model, load error, engine error) is a result with
`isError: true` and a message the calling model can act on, never a JSON-RPC error.
`lemonade_transcribe_audio` runs the same transcription as `/v1/audio/transcriptions`.
`lemonade_generate_image` runs the same generation as `/v1/images/generations` (api/mcp/image_tool.py)
and writes into the image sandbox. `lemonade_omni` runs the omni tool loop of chat completions
(`omni/loop.py`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from lemonade.api.errors import APIError
from lemonade.api.mcp import image_tool, schema
from lemonade.api.mcp.sandbox import SandboxError, confine, sandbox_root, unique_name
from lemonade.audio.formats import HEAD_BYTES
from lemonade.model_info import ModelInfo
from lemonade.omni import loop as omni_loop
from lemonade.omni import toolset as omni_toolset
from lemonade.omni.definitions import OMNI_RECIPE
from lemonade.runtime.engine_request import FileBody
from lemonade.services import Services
from lemonade.serving.chat import answer, forcing
from lemonade.serving.models import ENDPOINT_FOR_MODE, check_model
from lemonade.serving.transcription import check_audio, check_params, shaped, transcribe
from lemonade.util.atomic import atomic_write_bytes

log = logging.getLogger("lemonade.mcp")

DEFAULT_OMNI_MODEL = "LMX-Omni-5.5B-Lite"
CHAT_PASSTHROUGH = ("max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "presence_penalty",
                    "frequency_penalty", "tools", "tool_choice", "response_format", "chat_template_kwargs")
SIZE_RE = re.compile(r"^\d{2,5}x\d{2,5}$")


class ToolError(Exception):
    """A tool failure reported to the caller as `isError: true` with this message."""


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def result(*blocks: dict[str, Any], is_error: bool = False) -> dict[str, Any]:
    return {"content": list(blocks), "isError": is_error}


# ----- schemas -------------------------------------------------------------------------------------

_MODEL = {"type": "string", "minLength": 1}
_MESSAGES = {"type": "array", "minItems": 1, "description": "OpenAI chat format: [{role, content}, ...]",
             "items": {"type": "object", "required": ["role"],
                       "properties": {"role": {"type": "string",
                                               "enum": ["system", "developer", "user", "assistant", "tool"]},
                                      "content": {"type": ["string", "array", "null"]}}}}
_SANDBOX_NOTE = ("Confined to the MCP image sandbox (<cache dir>/mcp-images, or LEMONADE_MCP_IMAGE_DIR): relative "
                 "paths resolve against it, paths escaping it (.. or symlinks) are rejected.")

TOOLS: list[dict[str, Any]] = [
    {
        "name": "lemonade_list_models",
        "description": "List the models of this Lemonade server: loaded, downloaded (available) and suggested to "
                       "pull. Call this first if you do not know the exact model name to pass to the other tools "
                       "(a wrong name may trigger a multi-GB download). Returns a summary text block plus a JSON "
                       "block with {loaded, available, suggested_to_pull, recommended_chat_model}.",
        "inputSchema": {"type": "object", "properties": {
            "include_available": {"type": "boolean", "description": "List downloaded models (default true)"},
            "include_suggested": {"type": "boolean", "description": "List suggested models not downloaded yet "
                                                                    "(default true)"}}},
    },
    {
        "name": "lemonade_chat",
        "description": "Chat completion with a local LLM. Pass OpenAI-style `messages`. `model` is optional: "
                       "without it the most recently used loaded LLM is used, else a downloaded one. Thinking is "
                       "disabled by default; pass chat_template_kwargs {\"enable_thinking\": true} to allow it. "
                       "Returns the assistant text, plus a `tool_calls: [...]` block when the model calls tools.",
        "inputSchema": {"type": "object", "required": ["messages"], "properties": {
            "model": {**_MODEL, "description": "A model name from lemonade_list_models"},
            "messages": _MESSAGES,
            "max_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "minimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 0},
            "stop": {"type": ["string", "array"], "items": {"type": "string"}},
            "seed": {"type": "integer"},
            "presence_penalty": {"type": "number"},
            "frequency_penalty": {"type": "number"},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"type": ["string", "object"]},
            "response_format": {"type": "object"},
            "chat_template_kwargs": {"type": "object",
                                     "description": "e.g. {\"enable_thinking\": true}; thinking is off by default"},
            "stream": {"type": "boolean", "description": "Ignored: MCP results are returned whole"}}},
    },
    {
        "name": "lemonade_transcribe_audio",
        "description": "Transcribe a local audio file with a Whisper-class model. Prefer `audio_path` (the server "
                       "runs on the caller's machine); use `audio_base64` only for bytes in memory. Exactly one "
                       "of the two is required. Returns the transcript and the full OpenAI-shaped response.",
        "inputSchema": {"type": "object", "properties": {
            "model": {**_MODEL, "description": "A transcription model, e.g. Whisper-Tiny"},
            "audio_path": {"type": "string", "minLength": 1,
                           "description": "Absolute path of a local audio file (wav, mp3, flac, ogg or webm)"},
            "audio_base64": {"type": "string", "minLength": 1},
            "filename": {"type": "string"},
            "language": {"type": "string"},
            "prompt": {"type": "string"},
            "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1}}},
    },
    {
        "name": "lemonade_generate_image",
        "description": "Generate PNG images from a prompt. Prefer writing to disk with `output_path` (one image) "
                       "or `output_dir` (unique generated names); inline base64 images cost many tokens. "
                       + _SANDBOX_NOTE,
        "inputSchema": {"type": "object", "required": ["prompt"], "properties": {
            "model": {**_MODEL, "description": "An image model, e.g. SD-Turbo"},
            "prompt": {"type": "string", "minLength": 1},
            "output_path": {"type": "string", "description": "Exact PNG path to write (only with n = 1). "
                                                             + _SANDBOX_NOTE},
            "output_dir": {"type": "string", "description": "Folder for image_<token>_<i>.png files. "
                                                            + _SANDBOX_NOTE},
            "size": {"type": "string", "description": "WIDTHxHEIGHT, e.g. 512x512"},
            "n": {"type": "integer", "minimum": 1, "maximum": 8},
            "negative_prompt": {"type": "string"},
            "seed": {"type": "integer"},
            "steps": {"type": "integer", "minimum": 1, "maximum": 500},
            "cfg_scale": {"type": "number", "minimum": 0}}},
    },
    {
        "name": "lemonade_omni",
        "description": "One multimodal turn against a Lemonade Omni collection (a planner LLM with image, "
                       "image-edit and speech models). Returns text plus image/audio blocks, or file paths with "
                       f"`output_dir`. `model` defaults to a downloaded collection ({DEFAULT_OMNI_MODEL} first). Use "
                       "lemonade_chat for plain text. "
                       + _SANDBOX_NOTE,
        "inputSchema": {"type": "object", "required": ["messages"], "properties": {
            "model": {**_MODEL, "description": "A collection.omni model. Default: a downloaded one "
                                                f"({DEFAULT_OMNI_MODEL} first); name it to download it on first use"},
            "messages": _MESSAGES,
            "output_dir": {"type": "string", "description": "Folder for omni_<token>_<i>.<ext> files. "
                                                            + _SANDBOX_NOTE},
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"type": ["string", "object"]},
            "max_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2}}},
    },
]
TOOL_NAMES = {tool["name"] for tool in TOOLS}


# ----- helpers -------------------------------------------------------------------------------------

def find_model(svc: Services, name: str) -> ModelInfo:
    """A model of this server, or one only a peer of the LAN serves (backends/peer/peers.py)."""
    model = svc.catalog.find(name) or svc.forwarding.elsewhere(name)
    if model is None:
        raise ToolError(f"Unknown model '{name}'. Call lemonade_list_models to see the models of this server.")
    return model


def _output_dirs(svc: Services, args: dict[str, Any]) -> tuple[Path | None, Path | None]:
    """Validated (output_path, output_dir), confined to the sandbox."""
    if args.get("output_path") is not None and args.get("output_dir") is not None:
        raise ToolError("Provide at most one of `output_path` and `output_dir`, not both.")
    try:
        root = sandbox_root(svc.cache_dir)
        path = confine(args["output_path"], root, "output_path") if args.get("output_path") is not None else None
        folder = (confine(args["output_dir"], root, "output_dir", allow_root=True)
                  if args.get("output_dir") is not None else None)
    except SandboxError as exc:
        raise ToolError(str(exc)) from None
    if path is not None and path.suffix.lower() != ".png":
        raise ToolError(f"`output_path` must name a .png file, got {path.name}")
    return path, folder


def _chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text-only content arrays (as Claude Desktop sends them) flattened to strings, which every template reads."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            msg = {**msg, "content": "\n".join(str(p.get("text", "")) for p in content)}
        out.append(msg)
    return out


# Where a model of each mode is used through MCP ("use X instead" in refusals).
TOOL_FOR_MODE = {"chat": "lemonade_chat", "transcription": "lemonade_transcribe_audio",
                 "image": "lemonade_generate_image"}


def checked_model(svc: Services, name: str, mode: str, tool: str) -> ModelInfo:
    """The server's one model check (`serving/models.py` `check_model`), its refusal as a tool error."""
    try:
        return check_model(svc, find_model(svc, name), mode, tool, hint=TOOL_FOR_MODE)
    except APIError as exc:
        raise ToolError(exc.message) from None


def _pick_chat_model(svc: Services, name: str | None) -> ModelInfo:
    if name:
        return checked_model(svc, name, "chat", "lemonade_chat")
    loaded = svc.router.models("chat")
    if loaded:
        return loaded[0].model
    for model in svc.catalog.all():
        if model.mode == "chat" and svc.engines.available(model.recipe) and svc.catalog.is_downloaded(model):
            return model
    raise ToolError("No chat model is loaded or downloaded. Pass `model` (see lemonade_list_models); a model "
                    "that is not downloaded yet is downloaded first.")


# ----- tools ---------------------------------------------------------------------------------------

async def list_models(svc: Services, args: dict[str, Any]) -> dict[str, Any]:
    loaded = svc.router.describe()
    available: list[dict[str, Any]] = []
    suggested: list[dict[str, Any]] = []
    for model in svc.catalog.all():
        downloaded = svc.catalog.is_downloaded(model)
        entry: dict[str, Any] = {"model_name": model.public, "recipe": model.recipe, "type": model.type,
                                 "labels": list(model.labels)}
        if model.size:
            entry["size_gb"] = model.size
        if downloaded and args.get("include_available", True):
            available.append({**entry, "downloaded": True, "suggested": model.suggested})
        elif not downloaded and model.suggested and args.get("include_suggested", True):
            suggested.append(entry)
    llms = [m["model_name"] for m in loaded if m.get("type") == "llm"]
    recommended = llms[0] if llms else next((m["model_name"] for m in available
                                             if m["type"] == "llm" and svc.engines.available(m["recipe"])), "")
    payload = {"loaded": loaded, "available": available, "suggested_to_pull": suggested,
               "recommended_chat_model": recommended}
    if loaded:
        summary = "Loaded models: " + ", ".join(f"{m['model_name']} ({m['type']})" for m in loaded) + ". "
    else:
        summary = "No models are loaded. "
    if recommended:
        summary += f"Use `{recommended}` for lemonade_chat unless the user asks otherwise."
    elif suggested:
        summary += "No LLM is downloaded; suggested models to pull: " + ", ".join(
            m["model_name"] for m in suggested[:8]) + "."
    return result(text(summary), text(json.dumps(payload, default=str)))


async def chat(svc: Services, args: dict[str, Any]) -> dict[str, Any]:
    model = _pick_chat_model(svc, args.get("model"))
    body: dict[str, Any] = {"model": model.name, "messages": _chat_messages(args["messages"])}
    body.update({k: args[k] for k in CHAT_PASSTHROUGH if k in args})
    body.setdefault("chat_template_kwargs", {"enable_thinking": False})
    try:
        sent, name = forcing(body)  # a named tool is called, always (runtime/forced_call.py)
    except APIError as exc:
        raise ToolError(exc.message) from None
    try:
        data = await answer(svc, model, sent, name)
    except APIError as exc:
        raise ToolError(f"Chat with {model.public} failed: {exc.message}") from None
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = message.get("content") or ""
    if not content and message.get("reasoning_content"):
        note = "[reasoning only" + ("; finish_reason=length" if choice.get("finish_reason") == "length" else "") + "]"
        content = f"{note}\n{message['reasoning_content']}"
    blocks = [text(content)]
    if message.get("tool_calls"):
        blocks.append(text("tool_calls: " + json.dumps(message["tool_calls"])))
    return result(*blocks)



def _refuse_media_tool(svc: Services, args: dict[str, Any], mode: str, tool: str, what: str) -> ToolError:
    """Why a media tool cannot run here: the named model fails the model check, or its engine is
    not wired to MCP yet, or (no model named) the tool's engine is not available."""
    if not args.get("model"):
        return ToolError(f"{tool} cannot run: the {what} engine is not available in this server. Use "
                         "lemonade_chat for text generation.")
    model = checked_model(svc, args["model"], mode, tool)
    return ToolError(f"{tool} is not wired to the {model.recipe} engine in this server yet; call the HTTP API "
                    f"(/v1{ENDPOINT_FOR_MODE[mode]}) instead.")


def _pick_transcription_model(svc: Services) -> ModelInfo:
    """No `model` given: the most recently used loaded transcription model, else a downloaded one."""
    loaded = svc.router.models("transcription")
    if loaded:
        return loaded[0].model
    for model in svc.catalog.all():
        if model.mode == "transcription" and svc.engines.available(model.recipe) and svc.catalog.is_downloaded(model):
            return model
    raise ToolError("No transcription model is loaded or downloaded. Pass `model` (a transcription model from "
                    "lemonade_list_models, e.g. Whisper-Tiny-En-CT2); it is downloaded first if needed.")


def _audio_file(raw: str) -> tuple[Path, int]:
    """The file `audio_path` names and its size. Reads are not confined to the image sandbox (which
    guards writes): the spec's caller passes recordings from anywhere on its own machine. Only a
    file that starts like audio is read further (`check_audio`)."""
    if "\x00" in raw:
        raise ToolError("`audio_path` must not contain NUL characters")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ToolError(f"`audio_path` must be an absolute path (the server's working directory is not yours): {raw}")
    if not path.is_file():
        raise ToolError(f"audio_path not found (or not a file): {raw}")
    size = path.stat().st_size
    if size == 0:
        raise ToolError(f"audio_path is empty: {raw}")
    return path, size


async def transcribe_audio(svc: Services, args: dict[str, Any]) -> dict[str, Any]:
    has_path, has_b64 = args.get("audio_path") is not None, args.get("audio_base64") is not None
    if has_path == has_b64:
        raise ToolError("Provide exactly one of `audio_path` (path of a local audio file) or `audio_base64`.")
    path: Path | None = None
    if has_path:
        path, size = _audio_file(args["audio_path"])
    else:
        try:
            raw = base64.b64decode(args["audio_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise ToolError("`audio_base64` is not valid base64. To pass a file, use `audio_path`.") from None
        if not raw:
            raise ToolError("`audio_base64` decoded to zero bytes. To pass a file, use `audio_path`.")
    try:
        fmt, params = check_params(args.get("response_format"), args.get("language"), args.get("prompt"),
                                   args.get("temperature"))
    except APIError as exc:
        raise ToolError(exc.message) from None
    if args.get("model"):
        model = checked_model(svc, args["model"], "transcription", "lemonade_transcribe_audio")
    else:
        model = _pick_transcription_model(svc)
    with contextlib.ExitStack() as stack:
        if path is not None:
            fh = stack.enter_context(path.open("rb"))
            head = fh.read(HEAD_BYTES)
            body: bytes | FileBody = FileBody(fh, size)
        else:
            head, body = raw[:HEAD_BYTES], raw
        try:
            check_audio(svc, model, head)
            result = await transcribe(svc, model, body, params)
        except APIError as exc:
            raise ToolError(f"Transcription with {model.public} failed: {exc.message}") from None
    full, _media_type = shaped(result, fmt)
    return result_blocks(str(result.get("text", "")), full)


def result_blocks(transcript: str, full: str | dict[str, Any]) -> dict[str, Any]:
    """mcp.md: the bare transcript, then the full OpenAI-shaped response."""
    return result(text(transcript), text(full if isinstance(full, str) else json.dumps(full)))


async def generate_image(svc: Services, args: dict[str, Any]) -> dict[str, Any]:
    output_path, _output_dir = _output_dirs(svc, args)
    if output_path is not None and args.get("n", 1) != 1:
        raise ToolError("`output_path` names one file; use `output_dir` for n > 1.")
    if args.get("size") is not None and not SIZE_RE.match(args["size"]):
        raise ToolError(f"`size` must look like 512x512, got {args['size']!r}")
    try:
        return await image_tool.generate(svc, args, output_path, _output_dir)
    except image_tool.ImageToolError as exc:
        raise ToolError(str(exc)) from None


def _pick_omni_model(svc: Services) -> ModelInfo:
    """No `model` given: a downloaded omni collection (the default first), so that an agent's call
    never starts a multi-GB download it did not ask for; the default is downloaded when named."""
    omni = [m for m in svc.catalog.all() if m.recipe == OMNI_RECIPE and svc.catalog.is_downloaded(m)]
    default = svc.catalog.find(DEFAULT_OMNI_MODEL)
    if default is not None and default in omni:
        return default
    if omni:
        return omni[0]
    size = f" (a {default.size:g} GB download)" if default is not None and default.size else ""
    raise ToolError(f"lemonade_omni: no Omni collection is downloaded, so the default {DEFAULT_OMNI_MODEL} is not "
                    f"available yet{size}. Pass `model`: {DEFAULT_OMNI_MODEL} to download it on this call, or "
                    "another collection.omni model from lemonade_list_models.")


async def omni(svc: Services, args: dict[str, Any]) -> dict[str, Any]:
    """mcp.md `lemonade_omni`: the omni tool loop of chat completions, its media as MCP blocks or as
    files in the sandbox (`output_dir`), the client's tool calls as a `tool_calls:` block."""
    _path, folder = _output_dirs(svc, {"output_dir": args.get("output_dir")})
    model = find_model(svc, args["model"]) if args.get("model") else _pick_omni_model(svc)
    if model.recipe != OMNI_RECIPE:
        raise ToolError(f"Model {model.public} is not an Omni collection (collection.omni); use lemonade_chat for "
                        "a plain LLM.")
    request: dict[str, Any] = {"messages": _chat_messages(args["messages"])}
    request.update({k: args[k] for k in ("tools", "tool_choice", "max_tokens", "temperature") if k in args})
    request["chat_template_kwargs"] = {"enable_thinking": False}  # as lemonade_chat: the planner acts, briefly
    try:
        await svc.downloads.ready_collection(model)
        toolset = omni_toolset.build(svc, model, request.get("tools"))
        answer = None
        async for event in omni_loop.run(svc, toolset, request, omni_loop.prepare(svc, toolset, request)):
            if isinstance(event, omni_loop.Answer):
                answer = event
    except APIError as exc:
        raise ToolError(f"Omni run with {model.public} failed: {exc.message}") from None
    assert answer is not None
    blocks = [text(answer.text)]
    paths: list[str] = []
    for i, artifact in enumerate(answer.artifacts):
        if folder is None:
            blocks.append({"type": artifact.kind, "data": base64.b64encode(artifact.data).decode(),
                           "mimeType": artifact.mime})
            continue
        target = folder / unique_name("omni", i, "." + artifact.extension)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, artifact.data)
        paths.append(str(target))
        blocks.append(text(f"{artifact.kind} -> {target}"))
    if folder is not None:
        blocks.append(text(json.dumps({"paths": paths})))
    if answer.tool_calls:
        blocks.append(text("tool_calls: " + json.dumps(answer.tool_calls)))
    return result(*blocks)


HANDLERS: dict[str, Callable[[Services, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "lemonade_list_models": list_models,
    "lemonade_chat": chat,
    "lemonade_transcribe_audio": transcribe_audio,
    "lemonade_generate_image": generate_image,
    "lemonade_omni": omni,
}
SCHEMAS = {tool["name"]: tool["inputSchema"] for tool in TOOLS}


async def call(svc: Services, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one tool; every failure becomes an `isError` result."""
    problems = schema.errors(args, SCHEMAS[name])
    if problems:
        return result(text(f"Invalid arguments for {name}: " + "; ".join(problems)), is_error=True)
    try:
        return await HANDLERS[name](svc, args)
    except ToolError as exc:
        log.info("MCP %s: %s", name, exc)
        return result(text(f"Error: {exc}"), is_error=True)
    except APIError as exc:
        log.warning("MCP %s failed: %s", name, exc.message)
        return result(text(f"Error: {exc.message}"), is_error=True)
    except Exception as exc:  # noqa: BLE001 - a tool failure is a result, never a JSON-RPC error
        log.exception("MCP %s failed", name)
        return result(text(f"Error: {name} failed: {exc}"), is_error=True)
