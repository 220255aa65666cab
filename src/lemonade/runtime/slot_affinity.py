"""Each conversation goes back to its slot (issue 40).

An engine with several slots keeps one prompt's KV cache in each. llama-server picks, for a new
request, the idle slot whose cached prompt is most similar; when that slot is busy it takes another
and the conversation's cache is lost to it (and the other slot's conversation loses its own). The
router knows more: what each slot was last given. So a request that continues what a slot holds
(its text begins with all of it) is sent to that slot (`id_slot`), within a guard: a busy slot is
waited for by one request at most and only for a prefix worth it, so one hot conversation cannot
starve the others. A request that continues nothing goes to an empty slot rather than over another
conversation (a shared system prompt is read again once; the other conversation keeps its cache), and
only when none is empty to the idle slot with the longest prefix in common, then the one unused
longest, as llama-server would choose; when every slot is busy it waits for one.

The wait is here, never in the engine: a request is sent only once its slot is idle, and every
request with a prompt goes with its slot, its own `id_slot` or ours (llama-server picks none itself).
llama-server (b11312) runs its prompt-cache save and load on the slot a request names even while that
slot serves another request; the load replaces the running request's KV state, so its answer is
computed on another conversation's context, and when the loaded prompt is at least as long as the
running one's, that request never finishes: the engine spins, every request for the slot waits
behind it (tests/test_memory.py's capped workload hung for 8 minutes so; docs/warm-swaps.md, "One
request per slot").

A new conversation put in an empty slot would read a prefix another slot already holds (the system
prompt every conversation of an app or agent begins with) again: `donor` names the idle slot holding
the longest such prefix, and the proxy copies that slot's state into the new one first (llama-server's
slot save and restore, llamacpp.warm.copy_slot), so only what follows is read. When conversations arrive
together, no slot holds their shared beginning yet, only the first one's request reads it: the others
hold until its slot is idle and copy it (`lend_donor`), for at most as long as reading it would take them.

What a request gives the engine is told by its text: one line per message (or the prompt), serialised
the same way every time, so a conversation's next turn begins with exactly the text of its last one.
Only the first TEXT_KEPT characters are kept and compared.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

TEXT_KEPT = 1 << 18  # characters of a request's text compared (a quarter of a million: ~60k tokens)
WORTH_WAITING = 2048  # characters in common before a busy slot is worth waiting for (about 500 tokens)
WORTH_COPYING = 2048  # characters in common before another slot's state is worth copying (about 500 tokens)
# Seconds an engine takes to read one character of a request's text, until its own answers tell: Gemma 3 270M
# (the fastest model we ship) read chats of 4,400-22,000 characters at 5.8-7.4e-4 s a character on this
# project's 2 CPU cores, quiet (docs/warm-swaps.md, "A shared beginning read once"); a larger model reads
# slower, so a hold bounded by this is on the short side.
READ_COST_UNMEASURED = 5.0e-4
MEASURED_FROM = 256  # prompt tokens an answer must have read to tell the engine's reading speed
_STEP = 4096


def text_of(body: dict[str, Any]) -> str:
    """The request's prompt-bearing part, serialised the same way every time."""
    if isinstance(body.get("messages"), list):
        lines = (json.dumps(m, sort_keys=True, ensure_ascii=False) for m in body["messages"])
        return "".join(line + "\n" for line in lines)[:TEXT_KEPT]
    prompt = body.get("prompt")
    return prompt[:TEXT_KEPT] if isinstance(prompt, str) else ""


def common(a: str, b: str) -> int:
    """Length of the common prefix: whole chunks compared at C speed, then the one that differs."""
    n = min(len(a), len(b))
    i = 0
    while i + _STEP <= n and a[i:i + _STEP] == b[i:i + _STEP]:
        i += _STEP
    end = min(i + _STEP, n)
    while i < end and a[i] == b[i]:
        i += 1
    return i


@dataclass
class SlotAffinity:
    """What each slot of one engine holds, and which slots are serving now."""

    slots: int
    held: dict[int, str] = field(default_factory=dict)  # slot -> the text of the last request it served
    busy: dict[int, int] = field(default_factory=dict)  # slot -> requests given it (in the engine or waiting)
    last_use: dict[int, float] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)  # slots whose request is in the engine now
    serving: dict[int, str] = field(default_factory=dict)  # running slot -> the text it reads (or is copied from)
    read_cost: float = READ_COST_UNMEASURED  # seconds to read a character of text, from the engine's timings
    _measured: bool = False
    _queue: deque[asyncio.Future[None]] = field(default_factory=deque)  # requests waiting for any slot to free
    _for_slot: dict[int, deque[asyncio.Future[None]]] = field(default_factory=dict)  # ... for this slot to free
    _readers: dict[int, deque[asyncio.Future[None]]] = field(default_factory=dict)  # ... to copy this slot's state
    _reading: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # streamed, its prompt not read yet
    _answering_since: dict[int, float] = field(default_factory=dict)  # streamed, answering since (loop time)

    async def acquire(self, text: str, named: int | None = None) -> int | None:
        """The slot for a request with this text, or the one it names itself (`id_slot`, taken modulo the
        slot count as llama-server does), once it is idle (None: no slot is chosen, the engine has one).
        Taken until `release`; a request cancelled while it waits takes nothing.

        First come, first served: while requests wait for any slot to free, a new one queues behind them
        instead of taking the slot that has just freed."""
        if named is not None:
            slot = named % self.slots
        elif not text or self.slots < 2:
            return None
        else:
            chosen = None if self._queue else self.choose(text)
            woken = False
            while chosen is None:  # every slot busy, or earlier requests waiting: the next to free, in turn
                await self._wait(self._queue, first=woken)  # woken and still no slot: it keeps its place
                woken = True
                chosen = self.choose(text)
            slot = chosen
        self.take(slot)
        if named is None and self._queue:
            self._pass_on()  # another slot may still be idle for the next in the queue
        try:
            woken = False
            while slot in self.running:  # its own conversation's slot, still serving the turn before
                await self._wait(self._for_slot.setdefault(slot, deque()), first=woken)
                woken = True
        except BaseException:
            self.busy[slot] = max(0, self.busy.get(slot, 0) - 1)
            self._pass_on()
            raise
        self.running.add(slot)
        return slot

    async def _wait(self, queue: deque[asyncio.Future[None]], first: bool = False) -> None:
        """Waits in `queue` until woken; a request cancelled after it was woken hands its turn on."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if first:
            queue.appendleft(waiter)
        else:
            queue.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter in queue:
                queue.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self._pass_on()
            raise

    def _pass_on(self) -> None:
        """Wakes the one request that can now go: the first waiting to copy a slot no longer running, else the
        first waiting for such a slot (it holds it already), else the first waiting for any slot while one
        is idle. Waking one at a time spares the others comparing their texts again for a slot they cannot
        have."""
        for waiting in (self._readers, self._for_slot):  # a copy is short: it goes before the slot's next turn
            for slot, queue in waiting.items():
                if slot not in self.running and _wake_first(queue):
                    return
        if any(self.busy.get(s, 0) == 0 for s in range(self.slots)):
            _wake_first(self._queue)

    def choose(self, text: str) -> int | None:
        """The slot for a request with this text (None: every slot is busy and none is worth waiting for)."""
        if not text or self.slots < 2:
            return None
        score = {s: common(text, self.held.get(s, "")) for s in range(self.slots)}
        idle = [s for s in range(self.slots) if self.busy.get(s, 0) == 0]
        continued = [s for s in range(self.slots) if self.held.get(s) and score[s] == len(self.held[s])]
        if continued:
            own = max(continued, key=lambda s: (score[s], s in idle))
            if own in idle or (score[own] >= WORTH_WAITING and self.busy.get(own, 0) < 2):
                return own  # its own conversation is in it: wait for this one request, not longer
        if not idle:
            return None
        empty = [s for s in idle if not self.held.get(s)]
        if empty:
            return empty[0]
        # every slot holds another conversation: the longest prefix in common, else the one unused longest
        return max(idle, key=lambda s: (score[s], -self.last_use.get(s, 0.0)))

    def donor(self, text: str, slot: int) -> int | None:
        """The idle slot whose conversation shares the longest prefix with `text`, when copying its state
        into `slot` would save reading at least WORTH_COPYING more characters than `slot` already holds."""
        idle = {s: held for s, held in self.held.items() if s not in self.running and held}
        return self._worth_copying(text, slot, idle)[0]

    def _worth_copying(self, text: str, slot: int, texts: dict[int, str]) -> tuple[int | None, int]:
        """Of the slots in `texts` (slot -> what it holds or reads), the one sharing the longest beginning
        with `text`, and how many characters more than `slot` holds it would save (None: none saves
        WORTH_COPYING)."""
        have = common(text, self.held.get(slot, ""))
        best, best_len = None, have + WORTH_COPYING
        for s, other in texts.items():
            n = common(text, other) if s != slot else 0
            if n >= best_len:
                best, best_len = s, n
        return best, best_len - have

    async def lend_donor(self, text: str, slot: int) -> int | None:
        """The slot whose state a new conversation in `slot` should start from (`donor`), lent to it: the
        caller copies it and then releases it. When no idle slot holds the beginning but a running one
        reads it now (the first of several conversations arriving together with one system prompt), the
        request holds until that slot is idle, then copies it, rather than reading that beginning too, at
        once, on the same cores. The hold is bounded by what reading the shared part itself would cost, at
        the engine's measured reading speed shared with the requests it serves and those holding: the
        other request may be writing a long answer, and only an idle slot's state can be saved."""
        donor = self.donor(text, slot)
        if donor is None:
            donor = await self._hold_for_leader(text, slot)
        if donor is None:
            return None
        self.take(donor)
        self.running.add(donor)
        self.serving[donor] = self.held.get(donor, "")  # a conversation arriving meanwhile holds for it too
        return donor

    async def _hold_for_leader(self, text: str, slot: int) -> int | None:
        """The donor once the running slot reading `text`'s beginning is idle (None: none reads it, or not
        within the bound)."""
        leader, gain = self._worth_copying(text, slot, self.serving)  # the running slot reading it
        if leader is None:
            return None
        # reading it itself, it would share the cores with every request in the engine now and every other
        # holding one (each reads its own copy once its hold ends)
        holding = sum(len(queue) for queue in self._readers.values())
        alone = gain * self.read_cost * (1 + len(self.serving) + holding)
        loop = asyncio.get_running_loop()
        try:
            reading = self._reading.get(leader)
            if reading is not None:
                # a streamed request still reading its prompt has the shared part read no later than this
                # one could, on the same cores: the bound starts with its answer
                await asyncio.shield(reading)
            deadline = self._answering_since.get(leader, loop.time()) + alone
            while True:
                await asyncio.wait_for(self._until_idle(leader), max(0.0, deadline - loop.time()))
                donor = self.donor(text, slot)
                if donor is not None:
                    return donor
                if leader not in self.running:
                    self._pass_on()  # the wake-up was for a copy that is no longer worth it: the next one's
                    return None
                # another holding request took it first, to copy it too: this one's turn comes after
        except TimeoutError:
            return None

    async def _until_idle(self, slot: int) -> None:
        woken = False
        while slot in self.running:
            await self._wait(self._readers.setdefault(slot, deque()), first=woken)
            woken = True

    def sending(self, slot: int, text: str, streamed: bool) -> None:
        """The request given `slot` goes to the engine now: a conversation sharing its beginning may hold for
        it. A streamed one tells when its prompt is read (`answering`)."""
        self.serving[slot] = text
        if streamed:
            self._reading[slot] = asyncio.get_running_loop().create_future()

    def answering(self, slot: int) -> None:
        """The streamed request in `slot` sent its first token: its prompt is read."""
        _resolve(self._reading.pop(slot, None))
        self._answering_since[slot] = asyncio.get_running_loop().time()

    def take(self, slot: int) -> None:
        self.busy[slot] = self.busy.get(slot, 0) + 1

    def release(self, slot: int, text: str, timings: dict[str, Any] | None = None) -> None:
        """The request sent to `slot` is done: the slot now holds its conversation. `timings`: llama-server's
        figures for it, which tell how fast the engine reads."""
        self.busy[slot] = max(0, self.busy.get(slot, 0) - 1)
        self.running.discard(slot)
        self.serving.pop(slot, None)
        _resolve(self._reading.pop(slot, None))
        self._answering_since.pop(slot, None)
        if timings:
            self._learn(len(text), timings)
        self.held[slot] = text
        self.last_use[slot] = time.monotonic()
        self._pass_on()

    def _learn(self, chars: int, timings: dict[str, Any]) -> None:
        """The engine's reading speed, from a request that read enough of its text (the part not cached)."""
        read, cached, ms = timings.get("prompt_n"), timings.get("cache_n") or 0, timings.get("prompt_ms")
        if not (isinstance(read, int) and isinstance(cached, int) and isinstance(ms, (int, float))) \
                or read < MEASURED_FROM or ms <= 0 or chars >= TEXT_KEPT:
            return
        cost = ms / 1000 / (chars * read / (read + cached))
        self.read_cost = 0.7 * self.read_cost + 0.3 * cost if self._measured else cost
        self._measured = True

    def used_at(self) -> dict[int, float]:
        """When each slot that holds a conversation was last used, as wall-clock time (saved with its state,
        so a later load restores the most recent conversations first)."""
        shift = time.time() - time.monotonic()
        return {s: t + shift for s, t in self.last_use.items() if self.held.get(s)}

    def restored(self, held: dict[int, str]) -> None:
        """States restored into slots after a reload (backends/llamacpp/warm.py) hold these conversations."""
        self.held.update({s: t for s, t in held.items() if 0 <= s < self.slots})


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _wake_first(queue: deque[asyncio.Future[None]]) -> bool:
    """Wakes the first request still waiting in `queue` (False: none is)."""
    while queue:
        waiter = queue.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return True
    return False
