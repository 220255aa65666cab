"""The router's rules (runtime/router/rules.py) on plain records: no process, no clock, milliseconds.

Each case is one situation of Lemonade's multi-model guide or of the fair queue, and the decisions
the scheduler must carry out for it. The same rules run end to end in tests/test_swapping.py and
tests/test_serving.py on real engines.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

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


@dataclass(eq=False)
class W:
    """A waiting request."""

    name: str
    type: str = "llm"
    helper: bool = False
    remote: bool = False


def queue(waiters: list[W], residents: list[R], *, limit: int | dict[str, int] = 1,
          loading: dict[str, str] | None = None, retiring: list[R] | None = None, batch: int = 32) -> rules.Queue:
    limits = limit if isinstance(limit, dict) else None
    return rules.Queue(waiters, {r.name: r for r in residents}, loading or {}, retiring or [],
                       (lambda t: limits.get(t, 1)) if limits else (lambda t: limit), batch, NOW)


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


def test_one_eviction_at_a_time_per_type():
    a, b = R("a"), R("b")
    leaving = R("old", state=ModelState.RETIRING)
    assert rules.plan(queue([W("c")], [a, b], limit=3, retiring=[leaving])) == []


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
