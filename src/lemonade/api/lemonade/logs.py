"""`/logs/stream`: WebSocket log streaming (snapshot of retained entries, then live entries)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from lemonade.api.middleware import chosen_subprotocol
from lemonade.api.privacy import entry_view
from lemonade.observability.logs import LogEntry
from lemonade.services import Services
from lemonade.util import jsonparse

router = APIRouter(tags=["logs"])


def _parse_subscribe(text: str) -> tuple[int | None, str | None]:
    """(after_seq, error message)"""
    try:
        msg: Any = jsonparse.loads(text)
    except ValueError:
        return None, "Message is not valid JSON"
    if not isinstance(msg, dict) or msg.get("type") != "logs.subscribe":
        return None, "Expected {\"type\": \"logs.subscribe\", \"after_seq\": null|int}"
    after = msg.get("after_seq")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        return None, "'after_seq' must be null or a non-negative integer"
    return after, None


@router.websocket("/logs/stream")
async def logs_stream(ws: WebSocket) -> None:
    svc: Services = ws.app.state.services
    await ws.accept(subprotocol=chosen_subprotocol(ws.scope))
    show = entry_view(ws.scope, svc)
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
            if queue is not None:  # set with the sender
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
