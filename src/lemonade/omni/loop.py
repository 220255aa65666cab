"""The omni tool loop: the collection's LLM, called with the built-in prompt and tools, until it answers.

Each round is one chat completion of the collection's LLM (through the proxy, so it auto-loads like
any request). Calls to our tools run here, one after the other (`media.run_tool`); each medium is
yielded the moment it exists, so a stream can send it at once; their result text goes back to the
LLM as `tool` messages and the next round starts. A round that calls client tools ends the loop
with `finish_reason: "tool_calls"` (the client runs them and resumes); a round without tool calls
is the answer. A call repeated with the same arguments is not run again, and a round of nothing
but such repeats ends the loop (small models repeat a call instead of answering); a repeated call
whose result was text (a transcript, an analysis) makes the next round answer (no tools offered),
since that text is the LLM's to pass on. A later round
that the engine fails (5xx) once media exist ends the loop with those media rather than losing
them to the LLM's closing words; without media it is asked once more, to answer without tools. At
most `MAX_ROUNDS` LLM calls are made.

Media echoed back in the conversation (the client sends our earlier answers again) are replaced by
short placeholders before the LLM sees them: one image as base64 is more tokens than its context.
What the user sends is kept for the tools instead (`prepare`): each `input_audio` part becomes
"[User provided audio file #N]" for the LLM and clip N of the turn (`transcribe_audio`), as
Lemonade's app does it; a picture becomes "[User provided image #N]" and image N (`analyze_image`)
unless the LLM sees pictures itself, which then gets it as it came. Audio that is not base64 is a
400 naming the part, before anything runs.
The client's `tool_choice` applies to the first round only when it forces a call (`required` or a
named tool); later rounds are `auto`, else a forced call would repeat until the round limit. A named
tool is forced for real: llama-server's `required` still lets the model write text before the call
(its grammar allows any content ahead of `<tool_call>`), so a small model can talk until max_tokens
and never call. The first round instead asks for the tool's arguments under a JSON-schema grammar
(`response_format`, the tool still described in the prompt), and that answer becomes the call.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from lemonade.errors import APIError
from lemonade.omni.definitions import MAX_ROUNDS
from lemonade.omni.media import Artifact, Clip, Turn, run_tool
from lemonade.omni.toolset import Toolset
from lemonade.runtime import forced_call
from lemonade.services import Services
from lemonade.serving import chat
from lemonade.serving.models import accepts_images
from lemonade.util.jsonparse import loads

log = logging.getLogger("lemonade.omni")

_B64 = r"[A-Za-z0-9+/=]+"
ECHOED_MEDIA = [
    (re.compile(r"!\[[^\]\n]*\]\(\s*data:image/[\w.+-]+;base64," + _B64 + r"\s*\)"), "[generated image]"),
    (re.compile(r"<audio>\s*data:audio/[\w.+-]+;base64," + _B64 + r"\s*</audio>"), "[generated audio]"),
    (re.compile(r"data:([a-z]+)/[\w.+-]+;base64," + _B64), None),  # a bare data URL: "[image]", "[audio]", ...
]
NOT_SENT = ("messages", "model", "stream", "stream_options", "tools", "tool_choice", "max_completion_tokens")
GAVE_UP = "Sorry, I could not finish that request."


@dataclass
class Media:
    """A medium a tool just made."""

    artifact: Artifact


@dataclass
class Answer:
    """How the loop ended: the LLM's last text, the client-tool calls it made, the finish reason."""

    text: str
    finish_reason: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    id: str = ""
    created: int = 0

    def content(self) -> str:
        """The whole assistant `content`: the text, then every medium (the non-streamed shape)."""
        return "\n\n".join([p for p in (self.text,) if p] + [a.markdown() for a in self.artifacts])


def strip_media(text: str) -> str:
    for pattern, placeholder in ECHOED_MEDIA:
        def shown(m: re.Match[str], p: str | None = placeholder) -> str:
            return p or f"[{m.group(1)}]"

        text = pattern.sub(shown, text)
    return text


IMAGE_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,(" + _B64 + ")")


def last_image(messages: list[dict[str, Any]]) -> bytes | None:
    """The conversation's last image given as a data URL (in text, as our answers carry it, or as an
    `image_url` part), decoded; None when there is none."""
    found: str | None = None
    for msg in messages:
        content = msg.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if not isinstance(part, dict):
                continue
            url = part.get("image_url")
            text = url.get("url") if isinstance(url, dict) else url if isinstance(url, str) else part.get("text")
            for match in IMAGE_DATA_URL.finditer(text) if isinstance(text, str) else ():
                found = match.group(1)
    if found is None:
        return None
    try:
        return base64.b64decode(found, validate=True)
    except (binascii.Error, ValueError):
        return None


def _clip(part: dict[str, Any], where: str) -> Clip:
    """The audio of an `input_audio` part, decoded; a 400 naming the part when it is not base64."""
    audio = part.get("input_audio")
    data = audio.get("data") if isinstance(audio, dict) else None
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        raise APIError(400, f"Invalid value for '{where}.input_audio.data': the audio must be base64-encoded bytes "
                       "of an audio file (wav, mp3, ...)", code="invalid_argument")
    fmt = audio.get("format") if isinstance(audio, dict) else None
    return Clip(raw, fmt if isinstance(fmt, str) else "")


def _image_url(part: dict[str, Any]) -> str | None:
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    return url if isinstance(url, str) and url.startswith("data:image/") else None


def prepared_message(msg: dict[str, Any], llm_sees_images: bool, turn: Turn | None = None,
                     where: str = "message") -> dict[str, Any]:
    """A client message as the LLM gets it: echoed media as placeholders, what the user sent kept in
    `turn` for the tools (numbered in its placeholder), every other field kept (tool_calls,
    tool_call_id, name: a resumed client tool call must stay paired)."""
    content = msg.get("content")
    if isinstance(content, str):
        return {**msg, "content": strip_media(content)}
    if not isinstance(content, list):
        return {**msg, "content": content if content is not None else ""}
    from_user = msg.get("role") == "user"
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({**part, "text": strip_media(str(part.get("text", "")))})
        elif kind in ("image_url", "input_image"):
            url = _image_url(part)
            if from_user and llm_sees_images:
                parts.append(part)
            elif from_user and turn is not None and url is not None:
                turn.images.append(url)
                parts.append({"type": "text", "text": f"[User provided image #{len(turn.images)}]"})
            else:
                parts.append({"type": "text", "text": "[image]"})
        elif kind == "input_audio":
            if from_user and turn is not None:
                turn.audio.append(_clip(part, f"{where}.content[{j}]"))
                parts.append({"type": "text", "text": f"[User provided audio file #{len(turn.audio)}]"})
            else:
                parts.append({"type": "text", "text": "[audio]"})
        else:
            parts.append(part)
    if all(p.get("type") == "text" for p in parts):
        return {**msg, "content": "\n".join(str(p.get("text", "")) for p in parts)}
    return {**msg, "content": parts}


@dataclass
class Prepared:
    """One request made ready for the loop: the LLM's first messages and what the tools share."""

    messages: list[dict[str, Any]]
    turn: Turn


def prepare(svc: Services, toolset: Toolset, request: dict[str, Any]) -> Prepared:
    """The conversation for the LLM: the omni system prompt first (a client system prompt follows it,
    in the same message), echoed media replaced, the user's audio and pictures kept for the tools.
    Called before anything runs (a stream starts), so a bad part is a 400."""
    max_tokens = request.get("max_completion_tokens") or request.get("max_tokens")
    turn = Turn(artifacts=[], history_image=last_image(request["messages"]),
                max_tokens=max_tokens if isinstance(max_tokens, int) else None)
    sees_images = accepts_images(svc, toolset.llm)
    out = [prepared_message(m, sees_images, turn, f"messages[{i}]") for i, m in enumerate(request["messages"])]
    if out and out[0].get("role") in ("system", "developer") and isinstance(out[0].get("content"), str):
        out[0] = {**out[0], "role": "system", "content": toolset.system_prompt + "\n\n" + out[0]["content"]}
    else:
        out.insert(0, {"role": "system", "content": toolset.system_prompt})
    return Prepared(out, turn)


def forced_tool(toolset: Toolset, choice: Any) -> str | None:
    """The tool a named `tool_choice` forces in the first round (runtime/forced_call.py); a 400 for a
    name the collection's tools do not offer."""
    return forced_call.named_tool({"tools": toolset.tools, "tool_choice": choice})


def _add_usage(total: dict[str, int], usage: Any) -> None:
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            if isinstance(usage.get(key), int):
                total[key] = total.get(key, 0) + usage[key]


def _arguments(call: dict[str, Any]) -> dict[str, Any] | None:
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        args = loads(raw)
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def _replayable(call: dict[str, Any]) -> dict[str, Any]:
    """A call as the next rounds send it back: arguments that are not the text of a JSON object (a
    call cut by max_tokens, even to nothing: `_arguments` runs a blank one as `{}`, but llama-server
    parses every replayed argument string and answers 500 for an empty one) become `{}`, since
    llama-server refuses a conversation holding unparsable arguments (the tool's result already
    tells the LLM what was wrong)."""
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, dict) or (isinstance(raw, str) and raw.strip() and _arguments(call) is not None):
        return call
    return {**call, "function": {**(call.get("function") or {}), "arguments": "{}"}}


async def run(svc: Services, toolset: Toolset, request: dict[str, Any],
              prepared: Prepared) -> AsyncIterator[Media | Answer]:
    """Run the loop for one chat request (the validated body, as a dict, and what `prepare` made of
    it); yields each `Media` as it is made, then one `Answer`. An LLM error is raised (APIError),
    after any media already yielded."""
    messages, turn = prepared.messages, prepared.turn
    body = {k: v for k, v in request.items() if k not in NOT_SENT}
    if request.get("max_completion_tokens") is not None:
        body["max_tokens"] = request["max_completion_tokens"]
    choice = request.get("tool_choice")
    forced_name = forced_tool(toolset, choice)
    usage: dict[str, int] = {}
    done: set[str] = set()  # the calls that made a medium in this turn (name + arguments)
    told: set[str] = set()  # the calls whose text result (a transcript, an analysis) the LLM has
    must_answer = False  # the LLM asked again for a text result it has: the next round answers
    answer = Answer(text="", finish_reason="stop", id=f"chatcmpl-omni-{uuid.uuid4().hex[:24]}",
                    created=int(time.time()))
    for round_no in range(MAX_ROUNDS):
        if round_no == 0:
            tool_choice, named = choice, forced_name
        elif must_answer:  # no tools at all: llama-server parses tool calls even under tool_choice "none"
            tool_choice, named = None, None
        else:  # a forced call is not forced again: the LLM now answers or calls what it wants
            tool_choice, named = "auto" if choice == "required" or isinstance(choice, dict) else choice, None
        call_body = {**body, "model": toolset.llm.name, "messages": messages, "stream": False}
        if toolset.tools and not must_answer:
            call_body["tools"] = toolset.tools
            if tool_choice is not None:
                call_body["tool_choice"] = tool_choice
            if named is not None:
                call_body = forced_call.forced(call_body, named)
        try:
            data = await chat.answer(svc, toolset.llm, call_body, named)
        except APIError as exc:
            if exc.status < 500 or round_no == 0 or (must_answer and not turn.artifacts):
                raise
            if not turn.artifacts:
                # A tool's text result (a transcript) is there, but the LLM's next call failed (e.g. a
                # tool call cut by max_tokens, which llama-server cannot parse): it is asked once more,
                # to answer in words.
                log.warning("omni %s: round %d failed; asking the LLM to answer without tools: %s",
                            toolset.collection.public, round_no + 1, exc.message)
                must_answer = True
                continue
            # The media the user asked for exist; only the LLM's closing words failed: answer with them.
            log.warning("omni %s: round %d failed after media were made; answering with them: %s",
                        toolset.collection.public, round_no + 1, exc.message)
            break
        _add_usage(usage, data.get("usage"))
        choices = data.get("choices") or [{}]
        message = choices[0].get("message") or {}
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if not calls:
            answer.text, answer.finish_reason = text, choices[0].get("finish_reason") or "stop"
            break
        ours = [c for c in calls if toolset.is_server_tool((c.get("function") or {}).get("name"))]
        theirs = [c for c in calls if c not in ours]
        messages.append({"role": "assistant", "content": text or "", "tool_calls": [_replayable(c) for c in calls]})
        repeated = 0
        for call in ours:
            name = call["function"]["name"]
            args = _arguments(call)
            key = name + ":" + json.dumps(args, sort_keys=True)
            if args is None:
                result = "Error: the arguments are not a JSON object; call the tool again with valid JSON"
            elif key in done:
                repeated += 1
                result = "Skipped: this exact call already ran in this turn; its result was shown to the user."
            elif key in told:
                must_answer = True
                result = "Skipped: this exact call already ran in this turn; answer the user with its result above."
            elif name in toolset.mcp:  # a connected MCP server's tool: its result is text for the LLM
                server_id, tool = toolset.mcp[name]
                log.info("omni %s: %s on MCP server %s", toolset.collection.public, tool, server_id)
                result = await svc.mcp.call_as_text(server_id, tool, args)
                if not result.startswith("Error:"):
                    told.add(key)
            else:
                component = toolset.runs_on[name]
                log.info("omni %s: %s on %s", toolset.collection.public, name, component.public)
                result, artifact = await run_tool(svc, name, component, args, turn)
                if artifact is not None:
                    done.add(key)
                    yield Media(artifact)
                elif not result.startswith("Error:"):
                    told.add(key)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        if theirs:
            answer.text, answer.finish_reason, answer.tool_calls = text, "tool_calls", theirs
            break
        if repeated == len(calls):  # it only asks again for what it has: asking it once more would not help
            log.info("omni %s: the LLM repeated its tool calls; the loop ends", toolset.collection.public)
            answer.text = text
            break
    else:
        log.warning("omni %s: the LLM still called tools after %d rounds; stopped", toolset.collection.public,
                    MAX_ROUNDS)
        answer.text = "" if turn.artifacts else GAVE_UP
    answer.artifacts, answer.usage = turn.artifacts, usage
    yield answer
