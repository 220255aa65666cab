"""Warm swaps: a llama.cpp model's conversations outlive its process (docs/warm-swaps.md).

When a model is unloaded (to make room, idle, under pressure, on request, at shutdown), each of its
slots that holds a prompt is saved through llama-server's own slot API (`/slots/N?action=save`) into
the server's slot folder; when the same model is loaded again with a compatible configuration, the
states are restored before its first request, so the next turn of a conversation reads only what is
new. Each state carries a fingerprint of everything that decides the KV cache's layout (the model
files, the engine build, the context, the slots and whether they share one cache, the cache types,
the micro-batch, a full-size sliding-window cache) and is never restored into anything else.

The store is a folder of files per model under `<cache>/slots/`: `warm-<fingerprint>-s<slot>.bin`
(llama-server's own format) and a `.json` beside each (what it holds, when it was used, which
conversation it continues). A state is written under a `.partial` name and renamed once complete, so
no half file ever looks like a state; partials a crash left are removed. The store is capped in size
(`kv_store_gb`); the least recently used states go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemonade.backends.engine import EngineHTTP
from lemonade.backends.llamacpp.memory import engine_flags

log = logging.getLogger("lemonade.llamacpp")

PREFIX = "warm-"
# Flags whose values decide the KV cache's layout (what a saved state must match to be restored)
LAYOUT_FLAGS = {"-c": "ctx", "--ctx-size": "ctx", "-np": "slots", "--parallel": "slots",
                "-ctk": "k", "--cache-type-k": "k", "-ctv": "v", "--cache-type-v": "v",
                "-ub": "ubatch", "--ubatch-size": "ubatch", "-b": "batch", "--batch-size": "batch",
                "-m": "model", "--model": "model", "--mmproj": "mmproj", "-md": "draft", "--model-draft": "draft"}
LAYOUT_SWITCHES = {"-kvu": "unified", "--kv-unified": "unified", "-no-kvu": "separate", "--no-kv-unified": "separate",
                   "--swa-full": "swa_full"}
SAVE_TIMEOUT_S = 60.0  # all of a model's slots, at unload


def _identity(path: str) -> str:
    """A file as it is now: its path, size and modification time (a rebuilt or re-downloaded file differs)."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def fingerprint(argv: list[str]) -> str:
    """The layout a saved state belongs to, from the command the engine was started with: the engine
    binary and the model files by identity, and the flags that change the KV cache (later flags win,
    as in llama-server)."""
    layout: dict[str, str] = {"binary": _identity(argv[0])}
    for i, token in enumerate(argv):
        flag, eq, inline = token.partition("=")
        if flag in LAYOUT_FLAGS:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            key = LAYOUT_FLAGS[flag]
            layout[key] = _identity(value) if key in ("model", "mmproj", "draft") else value
        elif flag in LAYOUT_SWITCHES:
            layout[LAYOUT_SWITCHES[flag]] = "1"
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:24]


def slot_folder(argv: list[str]) -> Path | None:
    """Where this llama-server saves slots (its last `--slot-save-path`)."""
    folder = None
    for i, token in enumerate(argv):
        flag, eq, inline = token.partition("=")
        if flag == "--slot-save-path":
            folder = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return Path(folder) if folder else None


@dataclass
class State:
    """One saved slot: its file, the JSON beside it, and what the JSON says."""

    data: Path
    meta: dict[str, Any]

    @property
    def info(self) -> Path:
        return self.data.with_suffix(".json")

    @property
    def size(self) -> int:
        try:
            return self.data.stat().st_size
        except OSError:
            return 0


class WarmStore:
    """The saved states of every model, under `root` (the server's slot folder), capped at `cap_bytes`."""

    def __init__(self, root: Path, cap_bytes: int) -> None:
        self.root = root
        self.cap_bytes = cap_bytes

    def states(self, folder: Path | None = None) -> list[State]:
        out = []
        for info in sorted((folder or self.root).glob(f"**/{PREFIX}*.json") if folder is None
                           else folder.glob(f"{PREFIX}*.json")):
            data = info.with_suffix(".bin")
            try:
                meta = json.loads(info.read_text())
            except (OSError, ValueError):
                meta = None
            if meta is None or not data.is_file():
                with contextlib.suppress(OSError):
                    info.unlink()  # a description without its state (or unreadable): nothing to restore
                continue
            out.append(State(data, meta))
        return out

    def clean_partials(self) -> None:
        """States a crash cut short (never renamed into place), and states with no description."""
        for partial in self.root.glob(f"**/{PREFIX}*.partial"):
            with contextlib.suppress(OSError):
                partial.unlink()
        for data in self.root.glob(f"**/{PREFIX}*.bin"):
            if not data.with_suffix(".json").is_file():
                with contextlib.suppress(OSError):
                    data.unlink()

    def describe(self) -> dict[str, Any]:
        states = self.states()
        return {"states": len(states), "bytes": sum(s.size for s in states), "cap_bytes": self.cap_bytes}

    def forget(self, state: State) -> None:
        for path in (state.info, state.data):
            with contextlib.suppress(OSError):
                path.unlink()

    def trim(self) -> list[State]:
        """Drop the least recently used states until the store is within its cap; the ones dropped."""
        states = sorted(self.states(), key=lambda s: s.meta.get("used_at", 0))
        total = sum(s.size for s in states)
        dropped = []
        while states and total > self.cap_bytes:
            oldest = states.pop(0)
            total -= oldest.size
            self.forget(oldest)
            dropped.append(oldest)
        return dropped

    @staticmethod
    def write_meta(state_info: Path, meta: dict[str, Any]) -> None:
        """The JSON beside a state, replaced atomically (a reader sees the old one or the new one)."""
        tmp = state_info.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, state_info)


async def save_slots(store: WarmStore, base_url: str, client: EngineHTTP, argv: list[str],
                     keys: dict[int, str], used: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """Save every slot holding a prompt (the engine is idle); what was saved. `keys`: per slot, the
    conversation it holds (runtime/slot_affinity.py: its text), kept with the state so it is routed back;
    `used`: when each slot was last used (wall clock; now where not known), the order of restoring."""
    folder = slot_folder(argv)
    if folder is None or store.cap_bytes <= 0:
        return []
    fp = fingerprint(argv)
    status, content = await client.request("GET", base_url, "/slots")
    if status != 200:
        return []
    saved = []
    for slot in json.loads(content):
        sid, tokens = slot.get("id"), int(slot.get("n_prompt_tokens") or 0)
        if not isinstance(sid, int) or tokens <= 0:
            continue
        name = f"{PREFIX}{fp}-s{sid}"
        status, content = await client.request("POST", base_url, f"/slots/{sid}?action=save",
                                                json.dumps({"filename": name + ".partial"}).encode())
        partial = folder / (name + ".partial")
        if status != 200:
            log.warning("Saving slot %d in %s failed (%s): %s", sid, folder, status, content[:200])
            with contextlib.suppress(OSError):
                partial.unlink()
            continue
        answer = json.loads(content)
        data = folder / (name + ".bin")
        os.replace(partial, data)  # complete: it looks like a state only now
        now = time.time()
        meta = {"model": folder.name, "fingerprint": fp, "slot": sid, "tokens": answer.get("n_saved", tokens),
                "bytes": answer.get("n_written"), "saved_at": now, "used_at": (used or {}).get(sid, now),
                "held": keys.get(sid, "")}
        WarmStore.write_meta(data.with_suffix(".json"), meta)
        saved.append(meta)
    for gone in store.trim():
        log.info("Warm store over its %.1f GB cap: dropped the state of %s (slot %s), least recently used",
                 store.cap_bytes / 1e9, gone.meta.get("model"), gone.meta.get("slot"))
    return saved


def restore_budget(argv: list[str]) -> int | None:
    """Tokens of saved states a unified KV cache takes back at a load: all its cells but one slot's share,
    so the first new request finds room without llama-server clearing restored slots to make it (every
    saved conversation lost again). None: each slot has cells of its own, where a restore always fits."""
    flags = engine_flags(shlex.join(argv[1:]))
    if not flags.unified or flags.slots < 2:
        return None
    ctx = 0
    for i, token in enumerate(argv[:-1]):
        if token in ("-c", "--ctx-size") and argv[i + 1].isdigit():
            ctx = int(argv[i + 1])
    return ctx - ctx // flags.slots if ctx > 0 else None


async def restore_slots(store: WarmStore, base_url: str, client: EngineHTTP, argv: list[str]
                        ) -> tuple[dict[int, str], int]:
    """Restore the states saved for exactly this layout into their slots, the most recently used first
    and, in a unified cache, only as many as leave a slot's share free (`restore_budget`; the others stay
    saved); (the conversation each restored slot holds, tokens restored). A state that does not restore
    is dropped."""
    folder = slot_folder(argv)
    if folder is None or store.cap_bytes <= 0:
        return {}, 0
    fp = fingerprint(argv)
    budget = restore_budget(argv)
    keys: dict[int, str] = {}
    tokens = 0
    for state in sorted(store.states(folder), key=lambda s: -float(s.meta.get("used_at") or 0)):
        if state.meta.get("fingerprint") != fp:
            continue
        sid = state.meta.get("slot")
        if not isinstance(sid, int):  # a description written by hand or by another version
            store.forget(state)
            continue
        if budget is not None and tokens + int(state.meta.get("tokens") or 0) > budget:
            continue  # kept for a later load: this cache has no room for it beside the newer ones
        status, content = await client.request("POST", base_url, f"/slots/{sid}?action=restore",
                                                json.dumps({"filename": state.data.name}).encode())
        if status != 200:
            log.warning("A saved state of slot %s did not restore (%s): %s; dropped", sid, status, content[:200])
            store.forget(state)
            continue
        state.meta["used_at"] = time.time()
        WarmStore.write_meta(state.info, state.meta)
        keys[sid] = str(state.meta.get("held") or "")
        tokens += int(json.loads(content).get("n_restored") or 0)
    return keys, tokens


async def copy_slot(base_url: str, client: EngineHTTP, argv: list[str], src: int, dst: int) -> int:
    """Slot `src`'s state saved and restored into slot `dst` through a file of the slot folder, removed
    afterwards (named as a partial state: one a crash leaves is removed at the next start); the tokens
    restored, 0 when the engine refused either step."""
    folder = slot_folder(argv)
    if folder is None:
        return 0
    name = f"{PREFIX}copy-{src}-{dst}-{os.urandom(4).hex()}.partial"
    try:
        status, content = await client.request("POST", base_url, f"/slots/{src}?action=save",
                                                json.dumps({"filename": name}).encode())
        if status != 200:
            return 0
        status, content = await client.request("POST", base_url, f"/slots/{dst}?action=restore",
                                                json.dumps({"filename": name}).encode())
        return int(json.loads(content).get("n_restored") or 0) if status == 200 else 0
    finally:
        with contextlib.suppress(OSError):
            (folder / name).unlink()


async def with_timeout(coro: Any, seconds: float = SAVE_TIMEOUT_S) -> Any:
    """Saving must never hold an unload for long: past `seconds` the engine just stops."""
    return await asyncio.wait_for(coro, seconds)
