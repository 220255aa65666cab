"""The router's rules (runtime/router/rules.py) on plain records: no process, no clock, milliseconds.

Each case is one situation of Lemonade's multi-model guide or of the fair queue, and the decisions
the scheduler must carry out for it. The same rules run end to end in tests/test_swapping.py and
tests/test_serving.py on real engines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from lemonade.backends.engine import MemoryNeed
from lemonade.runtime.router import rules
from lemonade.runtime.router.state import HELPER, STANDARD, ModelState

NOW = 10_000.0


@dataclass(eq=False)
class R:
    """A resident as the rules read it."""

    name: str
    type: str = "llm"
    active: int = 0
    served: int = 0
    pinned: bool = False
    last_use: float = NOW - 10
    load_seconds: float = 1.0
    state: ModelState = ModelState.READY
    residency: str = STANDARD
    remote: bool = False
    usable: bool = True
    evict_weight: float = 1.0
    held_bytes: int = 0


@dataclass(eq=False)
class W:
    """A waiting request."""

    name: str
    type: str = "llm"
    helper: bool = False
    remote: bool = False
    need: MemoryNeed | None = None


def queue(waiters: list[W], residents: list[R], *, limit: int | dict[str, int] = 1,
          loading: dict[str, str] | None = None, retiring: list[R] | None = None, batch: int = 32,
          memory: int | None = None, loading_bytes: dict[str, int] | None = None) -> rules.Queue:
    limits = limit if isinstance(limit, dict) else None
    budget = rules.Memory(memory, "a 1 GiB cgroup limit", loading_bytes or {}) if memory is not None else None
    return rules.Queue(waiters, {r.name: r for r in residents}, loading or {}, retiring or [],
                       (lambda t: limits.get(t, 1)) if limits else (lambda t: limit), batch, NOW, memory=budget)


def kinds(decisions: list[rules.Decision]) -> list[tuple[str, str]]:
    """(decision, model or waiter name) pairs, for compact assertions."""
    out = []
    for d in decisions:
        target = d.waiter if isinstance(d, (rules.Admit, rules.Load, rules.Refuse)) else d.model
        out.append((type(d).__name__, target.name))
    return out


def test_waiters_of_a_resident_model_are_admitted_in_order():
    a = R("a")
    w1, w2 = W("a"), W("a")
    assert kinds(rules.plan(queue([w1, w2], [a]))) == [("Admit", "a"), ("Admit", "a")]
    assert [d.waiter for d in rules.plan(queue([w1, w2], [a]))] == [w1, w2]


def test_a_free_slot_starts_a_load_and_a_second_waiter_of_the_model_shares_it():
    assert kinds(rules.plan(queue([W("b"), W("b")], [], limit=2))) == [("Load", "b")]


def test_a_model_already_loading_is_not_loaded_again():
    assert rules.plan(queue([W("b")], [], loading={"b": "llm"})) == []


def test_full_type_evicts_the_idle_model_nobody_waits_for():
    a, b = R("a"), R("b", last_use=NOW - 1)
    decisions = rules.plan(queue([W("c")], [a, b], limit=2))
    assert kinds(decisions) == [("Evict", "a")]  # both idle; a has been idle longer
    assert decisions[0].for_name == "c"


def test_a_model_others_wait_for_is_kept_over_one_nobody_wants():
    a, b = R("a", last_use=NOW - 1), R("b", last_use=NOW - 1)
    # c needs a slot: b, which nobody waits for, leaves, not a (two requests wait for a)
    decisions = rules.plan(queue([W("c"), W("a")], [a, b], limit=2))
    assert kinds(decisions) == [("Admit", "a"), ("Evict", "b")]


def test_a_model_admitted_in_the_same_pass_is_busy_and_only_drains():
    a = R("a", last_use=NOW - 100)
    decisions = rules.plan(queue([W("a"), W("c")], [a]))
    # a was idle, but the pass admitted a request to it: it finishes that one before it leaves
    assert kinds(decisions) == [("Admit", "a"), ("Drain", "a")]


def test_eviction_score_prefers_cheap_reloads_and_long_idle():
    cheap = R("cheap", last_use=NOW - 10, load_seconds=0.5)
    costly = R("costly", last_use=NOW - 10, load_seconds=20.0)
    assert kinds(rules.plan(queue([W("x")], [cheap, costly], limit=2))) == [("Evict", "cheap")]
    weighted = R("cheap", last_use=NOW - 10, load_seconds=0.5, evict_weight=100.0)
    assert kinds(rules.plan(queue([W("x")], [weighted, costly], limit=2))) == [("Evict", "costly")]
    assert rules.eviction_score(10, 1, 1) > rules.eviction_score(1, 1, 1) > rules.eviction_score(1, 10, 1)


def test_a_busy_model_drains_after_its_batch_and_the_slot_changes_hands():
    a = R("a", active=1, served=32)
    decisions = rules.plan(queue([W("a"), W("b")], [a], batch=32))
    # a has served its batch while b waits: a's waiter is held back, a drains
    assert kinds(decisions) == [("Drain", "a")]
    under_batch = R("a", active=1, served=3)
    # under its batch a takes the request; nobody else waits for a, so it drains for b afterwards
    assert kinds(rules.plan(queue([W("a"), W("b")], [under_batch], batch=32))) == [("Admit", "a"), ("Drain", "a")]


def test_a_draining_model_with_requests_in_flight_is_waited_for():
    a = R("a", active=1, state=ModelState.DRAINING)
    assert rules.plan(queue([W("b")], [a])) == []
    idle = R("a", state=ModelState.DRAINING)
    assert kinds(rules.plan(queue([W("b")], [idle]))) == [("Evict", "a")]


def test_a_draining_model_nobody_needs_goes_back_into_service():
    a = R("a", state=ModelState.DRAINING)
    # a drained for b, whose request then left: a's own waiters get it back (not a reload of a)
    decisions = rules.plan(queue([W("a")], [a]))
    assert kinds(decisions) == [("Undrain", "a"), ("Admit", "a")]


def test_every_slot_pinned_refuses_with_409_and_names_the_holders():
    a = R("a", pinned=True)
    (refuse,) = rules.plan(queue([W("b"), W("b")], [a]))
    assert isinstance(refuse, rules.Refuse) and refuse.all_of_model
    assert refuse.error.status == 409 and refuse.error.code == "slots_pinned_error"
    assert "Cannot load b" in refuse.error.message and "(a)" in refuse.error.message


def test_pinned_slots_with_a_load_under_way_wait_instead_of_refusing():
    a = R("a", pinned=True)
    assert rules.plan(queue([W("b")], [a], limit=2, loading={"c": "llm"})) == []


def test_a_model_that_is_stopping_gives_its_slot_to_the_next_at_once_memory_permitting():
    a, b = R("a"), R("b")
    leaving = R("old", state=ModelState.RETIRING, held_bytes=400 * MiB)
    # the slot is free: the next model starts while the old one saves its conversations and exits
    assert kinds(rules.plan(queue([W("c")], [a, b], limit=3, retiring=[leaving]))) == [("Load", "c")]
    # ...but its memory is still counted until it is gone
    q = queue([W("c", need=chat_need(300))], [a, b], limit=3, retiring=[leaving], memory=600 * MiB)
    assert rules.plan(q) == []
    # and no second eviction of the type while one is under way
    assert rules.plan(queue([W("c"), W("d")], [a, b], limit=2, retiring=[leaving])) == []


def test_a_model_whose_old_process_is_stopping_waits_for_it():
    old = R("a", state=ModelState.RETIRING)
    assert rules.plan(queue([W("a"), W("b")], [], limit=5, retiring=[old])) == []


def test_types_have_their_own_slots():
    llm = R("chat")
    decisions = rules.plan(queue([W("emb", type="embedding")], [llm], limit={"llm": 1, "embedding": 1}))
    assert kinds(decisions) == [("Load", "emb")]


def test_unlimited_types_helpers_and_cloud_models_take_no_slot():
    a = R("a")
    assert kinds(rules.plan(queue([W("b")], [a], limit=-1))) == [("Load", "b")]
    assert kinds(rules.plan(queue([W("h", helper=True)], [a]))) == [("Load", "h")]
    assert kinds(rules.plan(queue([W("cloud", remote=True)], [a]))) == [("Load", "cloud")]


def test_a_helper_used_directly_moves_to_the_standard_pool_and_the_lru_leaves():
    helper = R("h", residency=HELPER)
    older, newer = R("a", last_use=NOW - 50), R("b", last_use=NOW - 5)
    (admit,) = rules.plan(queue([W("h")], [helper, older, newer], limit=2))
    assert isinstance(admit, rules.Admit) and admit.move_to == STANDARD
    assert [v.name for v in admit.evict] == ["a"]


def test_a_helper_used_directly_is_refused_when_pinned_models_hold_the_pool():
    helper = R("h", residency=HELPER)
    pinned = R("a", pinned=True)
    (refuse,) = rules.plan(queue([W("h")], [helper, pinned]))
    assert isinstance(refuse, rules.Refuse) and not refuse.all_of_model
    assert "Cannot use h directly" in refuse.error.message


def test_a_standard_model_a_policy_calls_is_promoted_without_evicting():
    a = R("a")
    (admit,) = rules.plan(queue([W("a", helper=True)], [a]))
    assert admit.move_to == HELPER and admit.evict == ()


def test_admits_fast_path_respects_the_batch_only_under_contention():
    a = R("a", served=40)
    assert rules.admits(a, queue([], [a]))
    assert not rules.admits(a, queue([W("b")], [a], batch=32))
    assert rules.admits(a, queue([W("b", type="embedding")], [a], batch=32))
    assert not rules.admits(R("x", state=ModelState.DRAINING), queue([], []))


@pytest.mark.parametrize(("idle", "downsized", "action"), [
    (5, False, None), (61, False, "downsize"), (61, True, None), (301, True, "evict"), (301, False, "evict")])
def test_idle_rules(idle, downsized, action):
    assert rules.idle_action(idle, evict_after=300, downsize_after=60, downsized=downsized) == action


def test_pressure_takes_the_most_disposable_candidate():
    fresh, stale = R("fresh", last_use=NOW - 1), R("stale", last_use=NOW - 500)
    assert rules.pressure_victim([fresh, stale], NOW) is stale
    assert rules.pressure_victim([], NOW) is None


# ----- memory admission --------------------------------------------------------------------------------
MiB = 1 << 20


def chat_need(fixed_mib: int, per_token: float = 0.0, ctx: int = 4096, ctx_min: int | None = None) -> MemoryNeed:
    return MemoryNeed(fixed_mib * MiB, ((per_token, None),) if per_token else (), ctx, ctx_min,
                      {"weights": fixed_mib * MiB})


def test_a_load_that_fits_starts_with_the_context_asked():
    (load,) = rules.plan(queue([W("b", need=chat_need(300))], [], memory=1024 * MiB))
    assert isinstance(load, rules.Load) and load.ctx == 4096 and load.bytes == 300 * MiB


def test_auto_context_gets_the_largest_that_fits_with_the_others_counted():
    other = R("emb", type="embedding", held_bytes=400 * MiB)
    need = chat_need(300, per_token=64 * 1024, ctx=32768, ctx_min=2048)  # 64 KiB a token
    (load,) = rules.plan(queue([W("b", need=need)], [other], limit={"llm": 1, "embedding": 1}, memory=1024 * MiB))
    # 1024 - 400 - 300 = 324 MiB left: 324 MiB / 64 KiB = 5184 tokens, in steps of 256
    assert load.ctx == 5120 and load.bytes == need.at(5120) <= 624 * MiB


def test_a_load_waits_for_a_stopping_model_only_when_that_gives_it_more():
    """The next model starts while the one it replaces stops, unless the memory still held by the one
    stopping would cut its automatic context, or leave out its speculative decoding."""
    leaving = R("old", state=ModelState.RETIRING, held_bytes=400 * MiB)
    need = chat_need(300, per_token=64 * 1024, ctx=32768, ctx_min=2048)
    # room for its whole context (300 MiB + 2 GiB) beside the one stopping: at once
    (load,) = rules.plan(queue([W("b", need=need)], [], retiring=[leaving], memory=3000 * MiB))
    assert load.ctx == 32768
    # 5,120 tokens fit now, 11,520 once it is gone: it waits, and then gets the larger context
    assert rules.plan(queue([W("b", need=need)], [], retiring=[leaving], memory=1024 * MiB)) == []
    (load,) = rules.plan(queue([W("b", need=need)], [], memory=1024 * MiB))
    assert load.ctx == 11520
    # all of it fits once the stopping one is gone, only the part without speculation now: it waits
    spec = MemoryNeed(450 * MiB, (), 4096, None, {"weights": 450 * MiB}, fallback=chat_need(300))
    assert rules.plan(queue([W("b", need=spec)], [], retiring=[leaving], memory=800 * MiB)) == []


def test_an_idle_model_of_another_type_leaves_when_memory_is_short():
    idle = R("emb", type="embedding", held_bytes=600 * MiB)
    decisions = rules.plan(queue([W("b", need=chat_need(600))], [idle], limit={"llm": 1, "embedding": 1},
                                 memory=1024 * MiB))
    assert kinds(decisions) == [("Evict", "emb")] and decisions[0].memory
    # once it has stopped (it is still counted while it stops), the load fits
    later = rules.plan(queue([W("b", need=chat_need(600))], [], retiring=[idle], memory=1024 * MiB))
    assert later == []
    assert kinds(rules.plan(queue([W("b", need=chat_need(600))], [], memory=1024 * MiB))) == [("Load", "b")]


def test_a_busy_model_drains_for_memory_and_stays_drained_while_the_load_waits():
    busy = R("emb", type="embedding", held_bytes=600 * MiB, active=2)
    q = queue([W("b", need=chat_need(600))], [busy], limit={"llm": 1, "embedding": 1}, memory=1024 * MiB)
    assert kinds(rules.plan(q)) == [("Drain", "emb")]
    drained = R("emb", type="embedding", held_bytes=600 * MiB, active=1, state=ModelState.DRAINING)
    q = queue([W("b", need=chat_need(600)), W("emb", type="embedding")], [drained],
              limit={"llm": 1, "embedding": 1}, memory=1024 * MiB)
    assert rules.plan(q) == []  # not undrained for its own waiter while b waits for memory


def test_a_load_that_can_never_fit_is_refused_with_507_and_what_would_help():
    pinned = R("big", pinned=True, held_bytes=700 * MiB, type="embedding")
    need = chat_need(300, per_token=64 * 1024, ctx=4096)  # 556 MiB; 324 MiB are free
    (refuse,) = rules.plan(queue([W("b", need=need)], [pinned], limit={"llm": 1, "embedding": 1},
                                 memory=1024 * MiB))
    assert isinstance(refuse, rules.Refuse) and refuse.error.status == 507
    assert refuse.error.code == "insufficient_memory"
    message = refuse.error.message
    assert "Cannot load b" in message and "a 1 GiB cgroup limit" in message
    assert "ctx_size" in message and "unloading pinned big" in message


def test_a_split_load_refused_for_this_hosts_share_says_it_is_a_share():
    """A load over RPC workers is admitted for the main host's share only; refused, the message
    must not read as if the whole model were asked of this host."""
    need = replace(chat_need(900), share="on this host, its share of a load whose layers the RPC workers hold")
    (refuse,) = rules.plan(queue([W("b", need=need)], [], memory=512 * MiB))
    assert refuse.error.status == 507
    assert "needs about 900 MiB on this host, its share of a load whose layers the RPC workers hold" \
        in refuse.error.message, refuse.error.message


def test_pinned_and_waited_for_models_are_the_last_to_leave_for_memory():
    fresh = R("fresh", type="embedding", held_bytes=300 * MiB, last_use=NOW - 1)
    stale = R("stale", type="tts", held_bytes=300 * MiB, last_use=NOW - 500)
    wanted = R("wanted", type="transcription", held_bytes=300 * MiB, last_use=NOW - 900)
    limits = {"llm": 1, "embedding": 1, "tts": 1, "transcription": 1}
    q = queue([W("b", need=chat_need(400)), W("wanted", type="transcription")], [fresh, stale, wanted],
              limit=limits, memory=1200 * MiB)
    decisions = rules.plan(q)
    # 1200 - 900 = 300 free; b needs 400: one model leaves, the stalest nobody waits for
    assert ("Evict", "stale") in kinds(decisions) and ("Evict", "wanted") not in kinds(decisions)


def test_loads_under_way_count_against_the_budget():
    need = chat_need(400)
    q = queue([W("c", type="embedding", need=need)], [], limit={"llm": 1, "embedding": 1},
              loading={"b": "llm"}, loading_bytes={"b": 700 * MiB}, memory=1024 * MiB)
    assert rules.plan(q) == []  # b may leave once it has served its waiters: c waits, it is not refused
    alone = queue([W("c", type="embedding", need=chat_need(1100))], [], limit={"llm": 1, "embedding": 1},
                  loading={"b": "llm"}, loading_bytes={"b": 700 * MiB}, memory=1024 * MiB)
    assert isinstance(rules.plan(alone)[0], rules.Refuse)  # more than the whole budget: refused at once



def test_what_an_engine_may_leave_out_goes_before_any_other_model():
    """Speculative decoding in auto (its drafted tokens' logits) yields to memory: the load starts
    without it rather than evicting another model or being refused."""
    other = R("emb", type="embedding", held_bytes=600 * MiB)
    plain = chat_need(300)
    need = MemoryNeed(450 * MiB, (), 4096, None, {"weights": 450 * MiB}, fallback=plain)
    (load,) = rules.plan(queue([W("b", need=need)], [other], limit={"llm": 1, "embedding": 1}, memory=1000 * MiB))
    assert isinstance(load, rules.Load) and load.fallback and load.bytes == 300 * MiB
    # with room for all of it, nothing is left out
    (load,) = rules.plan(queue([W("b", need=need)], [], memory=1000 * MiB))
    assert not load.fallback and load.bytes == 450 * MiB
    # short even without it: others make room for the smaller need
    decisions = rules.plan(queue([W("b", need=need)], [other], limit={"llm": 1, "embedding": 1}, memory=800 * MiB))
    assert kinds(decisions) == [("Evict", "emb")]
