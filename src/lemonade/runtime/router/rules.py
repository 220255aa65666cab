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
  unpinned model of the type leaves to make room (409 when every one is pinned: nothing changes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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


@dataclass(frozen=True)
class Evict:
    model: Any  # taken out of service now, stopped once idle
    for_name: str  # the model it makes room for


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


@dataclass
class Queue:
    """What the planner reads: the waiting requests (FIFO), the loaded models by name, the loads under
    way (name -> the slot type they count in), the processes still stopping, and the limits."""

    waiters: Sequence[Wanted]
    residents: Mapping[str, Resident]
    loading: Mapping[str, str]
    retiring: Sequence[Resident]
    limit: Callable[[str], int]
    batch: int
    now: float
    public: Callable[[Any], str] = field(default=lambda x: x.name)  # how an error names a model


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


def plan(q: Queue) -> list[Decision]:
    """Everything that should happen now for the waiting requests, in the order to carry it out."""
    sims = _sims(q)
    waiters = list(q.waiters)
    loading = dict(q.loading)
    retiring = [(lm.type, lm.residency == STANDARD and not lm.remote, lm.name) for lm in q.retiring]
    out: list[Decision] = []

    def contended(mtype: str) -> bool:
        return _contended(mtype, q, sims, waiters, loading)

    for s in sims.values():
        if s.state is ModelState.DRAINING and not contended(s.lm.type):
            s.state = ModelState.READY
            out.append(Undrain(s.lm))

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
                sims[victim.name].gone = True
                retiring.append((victim.type, True, victim.name))
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
    for w in list(waiters):
        name, mtype = w.name, w.type
        if name in seen or name in refused or (mtype in decided and not w.helper):
            continue
        seen.add(name)
        if name in loading or _has_process(name, sims):
            continue
        if any(r[2] == name for r in retiring):
            if not w.helper:
                decided.add(mtype)  # its old process is still stopping; load again once it is gone
            continue
        limit = q.limit(mtype)
        if limit == -1 or w.remote or w.helper or _occupied(mtype, sims, loading, retiring) < limit:
            loading[name] = "remote" if w.remote else HELPER if w.helper else mtype
            out.append(Load(w))
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
            sims[decision.model.name].gone = True
            retiring.append((mtype, True, decision.model.name))
        elif isinstance(decision, Drain):
            sims[decision.model.name].state = ModelState.DRAINING
    return out


def _occupied(mtype: str, sims: Mapping[str, _Sim], loading: Mapping[str, str],
              retiring: Sequence[tuple[str, bool, str]]) -> int:
    """Standard slots of the type taken: resident, loading and still stopping (helpers take none)."""
    names = {n for n, s in sims.items() if not s.gone and s.standard(mtype)}
    names |= {n for n, t in loading.items() if t == mtype}
    return len(names) + sum(1 for t, std, _ in retiring if std and t == mtype)


def _make_room(w: Wanted, q: Queue, sims: Mapping[str, _Sim], loading: Mapping[str, str],
               retiring: Sequence[tuple[str, bool, str]], waiters: Sequence[Wanted]) -> Decision | None:
    """The one step that frees a standard slot of `w`'s type, or None while one is already freeing."""
    mtype = w.type
    same = [s for s in sims.values() if not s.gone and s.standard(mtype)]
    candidates = [s for s in same if not s.lm.pinned]
    leaving = any(std and t == mtype for t, std, _ in retiring)
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
