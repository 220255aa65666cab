"""`/logs/stream`: WebSocket log streaming (snapshot of retained entries, then live entries)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from lemonade.api.middleware import chosen_subprotocol, is_admin
from lemonade.observability.logs import LogEntry
from lemonade.services import Services

router = APIRouter(tags=["logs"])


def _parse_subscribe(text: str) -> tuple[int | None, str | None]:
    """(after_seq, error message)"""
    try:
        msg: Any = json.loads(text)
    except ValueError:
        return None, "Message is not valid JSON"
    if not isinstance(msg, dict) or msg.get("type") != "logs.subscribe":
        return None, "Expected {\"type\": \"logs.subscribe\", \"after_seq\": null|int}"
    after = msg.get("after_seq")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        return None, "'after_seq' must be null or a non-negative integer"
    return after, None


def path_redactor(svc: Services) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Log entries with this machine's paths (cache dir, model dirs, home) shown as placeholders, for
    readers without admin rights: engine command lines and errors name files there."""
    values = svc.config.values
    places = [(str(svc.cache_dir), "<cache>"), (values.get("extra_models_dir") or "", "<extra_models_dir>"),
              (values.get("models_dir") or "", "<models_dir>"), (sys.prefix, "<python>"), (str(Path.home()), "~")]
    places = sorted(((str(Path(p).expanduser()), name) for p, name in places if p and p != "/"),
                    key=lambda item: -len(item[0]))

    def redact(entry: dict[str, Any]) -> dict[str, Any]:
        line = entry["line"]
        for path, name in places:
            line = line.replace(path, name)
        return {**entry, "line": line}

    return redact


@router.websocket("/logs/stream")
async def logs_stream(ws: WebSocket) -> None:
    svc: Services = ws.app.state.services
    await ws.accept(subprotocol=chosen_subprotocol(ws.scope))
    show = (lambda entry: entry) if is_admin(ws.scope, svc.api_key, svc.admin_key) else path_redactor(svc)
    logs = svc.logs
    queue: asyncio.Queue[LogEntry] | None = None
    sender: asyncio.Task[None] | None = None
    try:
        while True:
            after, error = _parse_subscribe(await ws.receive_text())
            if error:
                await ws.send_json({"type": "error", "message": error})
                continue
            if sender is not None:
                sender.cancel()
                logs.unsubscribe(queue)
            # Subscribe before the snapshot, and skip anything the snapshot already covered.
            queue = logs.subscribe()
            entries = logs.snapshot(after)
            await ws.send_json({"type": "logs.snapshot", "entries": [show(e) for e in entries]})
            last = entries[-1]["seq"] if entries else (after or 0)
            sender = asyncio.create_task(_forward(ws, queue, last, show))
    except WebSocketDisconnect:
        pass
    finally:
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
        if queue is not None:
            logs.unsubscribe(queue)


async def _forward(ws: WebSocket, queue: asyncio.Queue[LogEntry], last_seq: int,
                   show: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    while True:
        entry = await queue.get()
        if entry.seq <= last_seq:
            continue
        last_seq = entry.seq
        await ws.send_json({"type": "logs.entry", "entry": show(asdict(entry))})
