"""Residency rules: what should happen next, decided without touching a process, a file or a clock.

Lemonade's C++ server keeps these apart from the machinery (`model_residency.h`, `eviction_engine.h`);
so does this module. Every function here is pure: it reads records of the loaded models and the
waiting requests (anything with the attributes of `Resident` and `Wanted`: the scheduler passes its
own `LoadedModel` and `Waiter`, tests pass plain objects) and returns a decision. The scheduler
(scheduler.py) carries decisions out; housekeeping (housekeeping.py) asks the idle and pressure
rules. So each rule is checked in milliseconds (tests/unit/test_router_rules.py).

The rules (Lemonade's multi-model guide, and the queue that keeps swaps fair):
- a limit per model type (`max_loaded_models`); a routing helper and a cloud model take no slot;
- requests wait in one FIFO queue; a resident model serves the requests waiting for it, at most
  `swap_batch` of them once another model of its type waits, then drains and yields its slot;
- the model that leaves is one nobody waits for, else the most disposable by eviction score
  (idle time over load cost); a busy one drains first; every slot pinned → 409;
- a routing helper used directly by a user moves to the standard pool, whose least recently used
  unpinned model of the type leaves to make room (409 when every one is pinned: nothing changes);
- memory (docs/memory.md): a load starts only when its estimate fits what the budget leaves free
  after every loaded, loading and stopping model is counted at the most it may hold; idle unpinned
  models leave first (most disposable first, any type), busy ones drain; with `ctx_size: -1` it gets
  the largest context that fits. What cannot fit even then is refused before any process starts:
  507 `insufficient_memory`, naming what it needs, what is free and what would make it fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lemonade.backends.engine import MemoryNeed
from lemonade.errors import APIError
from lemonade.runtime.router.state import HELPER, STANDARD, ModelState


class Resident(Protocol):
    """A live engine process as the rules read it (the scheduler's LoadedModel)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def remote(self) -> bool: ...
    @property
    def usable(self) -> bool: ...
    @property
    def evict_weight(self) -> float: ...
    @property
    def held_bytes(self) -> int: ...
    state: ModelState
    residency: str
    active: int
    served: int
    pinned: bool
    last_use: float
    load_seconds: float


class Wanted(Protocol):
    """A waiting request as the rules read it (the scheduler's Waiter)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    helper: bool
    remote: bool
    need: MemoryNeed | None


# ----- decisions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Admit:
    """Give `waiter` its model now; `move_to`: the pool the process moves to first (promotion or
    demotion in place), after `evict` leave to make room in the standard pool."""

    waiter: Any
    model: Any
    move_to: str | None = None
    evict: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Load:
    waiter: Any  # its model starts loading into a slot (or no slot: helper, remote, unlimited type)
    ctx: int | None = None  # the context that fits the memory budget (its estimate's asked one, or the largest)
    bytes: int = 0  # what the load is counted for until it is loaded
    fallback: bool = False  # without what its need's `fallback` leaves out (memory was short)


@dataclass(frozen=True)
class Evict:
    model: Any  # taken out of service now, stopped once idle
    for_name: str  # the model it makes room for
    memory: bool = False  # room in memory, not a slot


@dataclass(frozen=True)
class Drain:
    model: Any  # admits no new requests; evicted when idle if its slot is still needed


@dataclass(frozen=True)
class Undrain:
    model: Any  # whoever needed its slot left or got one: back in service


@dataclass(frozen=True)
class Refuse:
    waiter: Any
    error: APIError
    all_of_model: bool = True  # every waiter of the model fails alike (a slot it can never get)


Decision = Admit | Load | Evict | Drain | Undrain | Refuse


# ----- small rules ---------------------------------------------------------------------------------------
def eviction_score(idle_seconds: float, load_seconds: float, weight: float) -> float:
    """guide-configuration-multi-model.md: idle time over load cost; higher = more disposable."""
    idle_ms = max(0.0, idle_seconds) * 1000 + 1.0
    return idle_ms / (max(load_seconds * 1000, 1.0) * max(weight, 1e-6))


def score(lm: Resident, now: float, last_use: float | None = None) -> float:
    return eviction_score(now - (lm.last_use if last_use is None else last_use), lm.load_seconds, lm.evict_weight)


def idle_action(idle_seconds: float, evict_after: float, downsize_after: float, downsized: bool) -> str | None:
    """For an idle, unpinned model with auto_evict: "evict", "downsize" (clear its KV cache) or None."""
    if idle_seconds >= evict_after:
        return "evict"
    if idle_seconds >= downsize_after and not downsized:
        return "downsize"
    return None


def pressure_victim(candidates: Iterable[Resident], now: float) -> Resident | None:
    """Under memory pressure: the most disposable of the candidates (idle, unpinned, auto_evict)."""
    pool = list(candidates)
    return max(pool, key=lambda lm: score(lm, now)) if pool else None


def slots_pinned(name: str, limit: int, mtype: str, holders: Iterable[str], directly: bool = False) -> APIError:
    what = f"use {name} directly" if directly else f"load {name}"
    return APIError(409, f"Cannot {what}: all {limit} {mtype} slot(s) are held by pinned models "
                    f"({', '.join(holders)}). Unload one, or raise max_loaded_models.", type="conflict",
                    code="slots_pinned_error")


def standard_room(lm: Resident, others: Sequence[Resident], limit: int,
                  public: Callable[[Any], str]) -> list[Resident]:
    """The models that leave so `lm`, a helper, can count in the standard pool of its type: least
    recently used unpinned ones first. `others`: the usable standard models of the type but `lm`.
    Raises 409 (and nothing leaves) when pinned models hold every slot."""
    if limit == -1:
        return []
    left = list(others)
    victims: list[Resident] = []
    while len(left) >= limit:
        movable = [x for x in left if not x.pinned]
        if not movable:
            raise slots_pinned(public(lm), limit, lm.type, (public(x) for x in others), directly=True)
        victim = min(movable, key=lambda x: x.last_use)
        left.remove(victim)
        victims.append(victim)
    return victims


# ----- the queue -----------------------------------------------------------------------------------------
@dataclass
class _Sim:
    """The part of a resident the planner changes as it decides (the real records change only when
    the scheduler carries the decisions out)."""

    lm: Resident
    state: ModelState
    served: int
    active: int
    last_use: float
    residency: str
    gone: bool = False  # evicted in this plan

    @property
    def usable(self) -> bool:
        return self.lm.usable and not self.gone and self.state is not ModelState.RETIRING

    def standard(self, mtype: str) -> bool:
        return self.lm.type == mtype and self.residency == STANDARD and not self.lm.remote


@dataclass(frozen=True)
class Memory:
    """The memory budget as the planner reads it: what our engines may hold together now (the budget
    less a reserve), what set it (for messages), and the bytes each load under way is counted for."""

    budget: int
    source: str = "the memory budget"
    loading: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Queue:
    """What the planner reads: the waiting requests (FIFO), the loaded models by name, the loads under
    way (name -> the slot type they count in), the processes still stopping, the limits, and the
    memory budget (None: no memory check, as for a GPU the server does not account)."""

    waiters: Sequence[Wanted]
    residents: Mapping[str, Resident]
    loading: Mapping[str, str]
    retiring: Sequence[Resident]
    limit: Callable[[str], int]
    batch: int
    now: float
    public: Callable[[Any], str] = field(default=lambda x: x.name)  # how an error names a model
    memory: Memory | None = None


def admits(lm: Resident, q: Queue, *, helper: bool = False) -> bool:
    """May `lm` take one more request at once (the fast path of acquire)? Not when it is leaving or
    draining, nor past its batch while a standard model of its type waits for a slot (a helper's use
    of a helper takes no such slot)."""
    if lm.state in (ModelState.DRAINING, ModelState.RETIRING):
        return False
    if q.waiters and not (helper and lm.residency == HELPER) and _contended(lm.type, q, _sims(q)):
        return lm.served < q.batch
    return True


def _sims(q: Queue) -> dict[str, _Sim]:
    return {name: _Sim(lm, lm.state, lm.served, lm.active, lm.last_use, lm.residency)
            for name, lm in q.residents.items()}


def _has_process(name: str, sims: Mapping[str, _Sim]) -> bool:
    """Is the model running (admitting, or draining: it admits again once nobody needs its slot)?"""
    s = sims.get(name)
    return s is not None and s.usable


def _contended(mtype: str, q: Queue, sims: Mapping[str, _Sim], waiters: Sequence[Wanted] | None = None,
               loading: Mapping[str, str] | None = None) -> bool:
    """Does a request wait for a standard model of this type that has no process and is not loading?
    (The waiters of a draining model need no slot: they wait for it to admit again.)"""
    loading = q.loading if loading is None else loading
    return any(w.type == mtype and not w.helper and not _has_process(w.name, sims) and w.name not in loading
               for w in (q.waiters if waiters is None else waiters))


@dataclass
class _Leaving:
    """A process stopping (before the plan, or evicted in it): it holds its slot and memory until gone."""

    type: str
    standard: bool
    name: str
    bytes: int


def plan(q: Queue) -> list[Decision]:
    """Everything that should happen now for the waiting requests, in the order to carry it out."""
    sims = _sims(q)
    waiters = list(q.waiters)
    loading = dict(q.loading)
    loading_bytes = dict(q.memory.loading) if q.memory is not None else {}
    retiring = [_Leaving(lm.type, lm.residency == STANDARD and not lm.remote, lm.name, lm.held_bytes)
                for lm in q.retiring]
    out: list[Decision] = []

    def contended(mtype: str) -> bool:
        return _contended(mtype, q, sims, waiters, loading)

    def leave(s: _Sim) -> None:
        s.gone = True
        retiring.append(_Leaving(s.lm.type, s.standard(s.lm.type), s.lm.name, s.lm.held_bytes))

    short = _memory_waiting(q, sims, waiters, loading, loading_bytes, retiring)
    for sim in sims.values():
        if sim.state is ModelState.DRAINING and not contended(sim.lm.type) and not short:
            sim.state = ModelState.READY
            out.append(Undrain(sim.lm))

    # 1. Admit waiters whose model is resident, FIFO; bounded by the batch while others wait.
    for w in list(waiters):
        s = sims.get(w.name)
        if s is None or not s.usable or s.state is ModelState.DRAINING:
            continue
        if s.residency == STANDARD and contended(s.lm.type) and s.served >= q.batch:
            continue  # its batch is served; the slot goes to the model waiting longest
        waiters.remove(w)
        want = HELPER if w.helper else STANDARD
        if s.residency == want or s.lm.remote:
            out.append(Admit(w, s.lm))
        else:
            evict: list[Resident] = []
            if want == STANDARD:
                others = [x.lm for x in sims.values() if x is not s and x.usable and x.standard(s.lm.type)]
                try:
                    evict = standard_room(s.lm, others, q.limit(s.lm.type), q.public)
                except APIError as exc:
                    out.append(Refuse(w, exc, all_of_model=False))
                    continue
            for victim in evict:
                leave(sims[victim.name])
            s.residency = want
            out.append(Admit(w, s.lm, move_to=want, evict=tuple(evict)))
        s.served += 1
        s.active += 1
        s.last_use = q.now
        if s.state is ModelState.DOWNSIZED:
            s.state = ModelState.READY

    # 2. Models that need a slot, in order of their oldest waiter; one decision per type per pass.
    decided: set[str] = set()
    seen: set[str] = set()
    refused: set[str] = set()
    memory_decided = False  # one memory decision per pass: the next sees what it freed
    for w in list(waiters):
        name, mtype = w.name, w.type
        if name in seen or name in refused or (mtype in decided and not w.helper):
            continue
        seen.add(name)
        if name in loading or _has_process(name, sims):
            continue
        if any(r.name == name for r in retiring):
            if not w.helper:
                decided.add(mtype)  # its old process is still stopping; load again once it is gone
            continue
        limit = q.limit(mtype)
        if limit == -1 or w.remote or w.helper or _occupied(mtype, sims, loading, retiring) < limit:
            if memory_decided and w.need is not None and q.memory is not None:
                continue
            decisions = _memory_room(w, q, sims, loading_bytes, retiring, waiters)
            if decisions and isinstance(decisions[0], Load):
                loading[name] = "remote" if w.remote else HELPER if w.helper else mtype
                loading_bytes[name] = decisions[0].bytes
            elif w.need is not None:
                memory_decided = True
            for d in decisions:
                out.append(d)
                if isinstance(d, Evict):
                    leave(sims[d.model.name])
                elif isinstance(d, Drain):
                    sims[d.model.name].state = ModelState.DRAINING
                elif isinstance(d, Refuse):
                    refused.add(name)
                    waiters = [x for x in waiters if x.name != name]
            continue
        decided.add(mtype)
        decision = _make_room(w, q, sims, loading, retiring, waiters)
        if decision is None:
            continue
        out.append(decision)
        if isinstance(decision, Refuse):
            refused.add(name)
            waiters = [x for x in waiters if x.name != name]
        elif isinstance(decision, Evict):
            leave(sims[decision.model.name])
        elif isinstance(decision, Drain):
            sims[decision.model.name].state = ModelState.DRAINING
    return out


# ----- memory ------------------------------------------------------------------------------------------
def _free(q: Queue, sims: Mapping[str, _Sim], loading_bytes: Mapping[str, int],
          retiring: Sequence[_Leaving]) -> int:
    """What the budget leaves free once every loaded, loading and stopping model is counted."""
    assert q.memory is not None
    held = sum(s.lm.held_bytes for s in sims.values() if not s.gone and not s.lm.remote)
    return q.memory.budget - held - sum(loading_bytes.values()) - sum(r.bytes for r in retiring)


def _memory_waiting(q: Queue, sims: Mapping[str, _Sim], waiters: Sequence[Wanted], loading: Mapping[str, str],
                    loading_bytes: Mapping[str, int], retiring: Sequence[_Leaving]) -> bool:
    """Does a request wait for memory (its load does not fit what is free)? Then a model that drained
    to make room stays drained."""
    if q.memory is None:
        return False
    free = _free(q, sims, loading_bytes, retiring)
    return any(w.need is not None and w.name not in loading and not _has_process(w.name, sims)
               and w.need.fit(free) is None for w in waiters)


def _memory_room(w: Wanted, q: Queue, sims: Mapping[str, _Sim], loading_bytes: Mapping[str, int],
                 retiring: Sequence[_Leaving], waiters: Sequence[Wanted]) -> list[Decision]:
    """For a load that has its slot: [Load] when its estimate fits what is free (with the context that
    fits), else what makes room in memory (evictions, drains; nothing while stopping processes will
    free enough), or a 507 refusal when even every unpinned model leaving would not be enough."""
    need = w.need
    if need is None or q.memory is None:
        return [Load(w)]
    free = _free(q, sims, loading_bytes, retiring)
    stopping = sum(r.bytes for r in retiring)
    ctx = need.fit(free)
    after = need.fit(free + stopping) if stopping else ctx  # what it gets once the one stopping is gone
    # The next model starts beside one that is stopping, unless waiting for it gives the load more: a
    # larger automatic context, or room for all of it rather than the fallback without speculation.
    if ctx is not None and after == ctx:
        return [Load(w, ctx or None, need.at(ctx or None))]
    if after is not None:
        return []  # what is stopping will free enough, or more
    if need.fallback is not None:  # what the engine may leave out goes before any other model does
        need = need.fallback
        ctx = need.fit(free)
        if ctx is not None:
            return [Load(w, ctx or None, need.at(ctx or None), fallback=True)]
    if stopping and need.fit(free + stopping) is not None:
        return []  # what is stopping will free enough
    waiting = {x.name for x in waiters}
    movable = [s for s in sims.values() if not s.gone and s.usable and not s.lm.pinned and not s.lm.remote]
    movable.sort(key=lambda s: (s.active > 0, s.lm.name in waiting, -score(s.lm, q.now, s.last_use)))
    chosen: list[_Sim] = []
    room = free + sum(r.bytes for r in retiring)
    for s in movable:
        if need.fit(room) is not None:
            break
        chosen.append(s)
        room += s.lm.held_bytes
    if need.fit(room) is None:
        if need.fit(room + sum(loading_bytes.values())) is not None:
            return []  # a load under way may leave again once it has served its waiters
        return [Refuse(w, insufficient_memory(w, need, q, sims, free))]
    return [Evict(s.lm, w.name, memory=True) if s.active == 0 else Drain(s.lm)
            for s in chosen if s.active == 0 or s.state is not ModelState.DRAINING]


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def insufficient_memory(w: Wanted, need: MemoryNeed, q: Queue, sims: Mapping[str, _Sim], free: int) -> APIError:
    """507: the load cannot fit; what it needs (its smallest form), what is free, and what would help."""
    assert q.memory is not None
    lowest = need.at(need.ctx_min if need.ctx_min is not None else need.ctx)
    parts = ", ".join(f"{k.replace('_', ' ')} {_mib(v)}" for k, v in need.parts.items() if v >= 2**20)
    pinned = [s for s in sims.values() if not s.gone and s.usable and s.lm.pinned and not s.lm.remote]
    unpinned = sum(s.lm.held_bytes for s in sims.values() if not s.gone and s.usable and not s.lm.pinned
                   and not s.lm.remote)
    best = free + unpinned  # every unpinned model unloaded
    hints = []
    if need.ctx:
        smaller = MemoryNeed(need.fixed, need.terms, need.ctx, MemoryNeed.ALIGN, need.parts).fit(best)
        if smaller:
            hints.append(f"a smaller ctx_size ({smaller} tokens would fit)")
        hints.append("fewer slots (-np N in llamacpp_args)")
    if pinned and need.fit(best + sum(s.lm.held_bytes for s in pinned)) is not None:
        hints.append("unloading pinned " + ", ".join(f"{q.public(s.lm)} ({_mib(s.lm.held_bytes)})" for s in pinned))
    hints.append("more memory for this server")
    context = f" at {need.ctx_min if need.auto else need.ctx} tokens of context" if need.ctx else ""
    share = f" {need.share}" if need.share else ""
    return APIError(507, f"Cannot load {q.public(w)}: it needs about {_mib(lowest)}{share}{context} ({parts}), and "
                    f"{_mib(max(0, best))} of the {_mib(q.memory.budget)} this server may use ({q.memory.source}) "
                    f"can be made free. What would make it fit: {'; '.join(hints)}.", type="server_error",
                    code="insufficient_memory")


def _occupied(mtype: str, sims: Mapping[str, _Sim], loading: Mapping[str, str], retiring: Sequence[_Leaving]) -> int:
    """Standard slots of the type taken: resident and loading (helpers take none). A model still stopping
    has given its slot up: the next one starts while it saves its conversations and exits, as long as
    both fit in memory (it is counted there until it is gone)."""
    names = {n for n, s in sims.items() if not s.gone and s.standard(mtype)}
    names |= {n for n, t in loading.items() if t == mtype}
    return len(names)


def _make_room(w: Wanted, q: Queue, sims: Mapping[str, _Sim], loading: Mapping[str, str],
               retiring: Sequence[_Leaving], waiters: Sequence[Wanted]) -> Decision | None:
    """The one step that frees a standard slot of `w`'s type, or None while one is already freeing."""
    mtype = w.type
    same = [s for s in sims.values() if not s.gone and s.standard(mtype)]
    candidates = [s for s in same if not s.lm.pinned]
    leaving = any(r.standard and r.type == mtype for r in retiring)
    if not candidates:
        if mtype not in loading.values() and not leaving:
            return Refuse(w, slots_pinned(q.public(w), q.limit(mtype), mtype, (q.public(s.lm) for s in same)))
        return None
    if leaving:
        return None  # one eviction at a time per type: wait for the one under way
    draining = [s for s in candidates if s.state is ModelState.DRAINING]
    if draining and draining[0].active > 0:
        return None  # it is finishing its requests; the scheduler plans again when it goes idle
    waiting = {x.name for x in waiters}
    # Prefer a model nobody is waiting for, then by eviction score (idle longest, cheap to reload).
    victim = draining[0] if draining else \
        min(candidates, key=lambda s: (s.lm.name in waiting, -score(s.lm, q.now, s.last_use)))
    if victim.active == 0:
        return Evict(victim.lm, w.name)
    if victim.served >= q.batch or victim.lm.name not in waiting:
        return Drain(victim.lm)
    return None
