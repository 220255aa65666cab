"""The speculation controller's rules (runtime/speculation.py): pure functions of the engine's
figures and a clock passed in, so no engine and no waiting. That the engine's real figures reach
them, and what a user sees, is proven end to end in tests/test_speculative.py."""

from __future__ import annotations

import pytest

from lemonade.runtime import speculation as rules
from lemonade.runtime.speculation import Answer, SpeculationController, wants_probabilities

M = "user.M"


def stock(ms_per_token: float = 20.0, tokens: int = 100) -> Answer:
    """An answer that drafted nothing (an engine without speculation, or nothing repeated)."""
    return Answer(tokens, tokens * ms_per_token)


def drafted(speedup: float, ms_per_token: float = 20.0, tokens: int = 100) -> Answer:
    """An answer that drafted, `speedup` times faster than the stock speed."""
    return Answer(tokens, tokens * ms_per_token / speedup, drafted=80, accepted=60)


def feed(c: SpeculationController, answers: list[Answer], now: float = 0.0, speculating: bool = True,
         switchable: bool = True) -> list[float | None]:
    return [c.observe(M, a, speculating, switchable, now) for a in answers]


def test_a_model_starts_speculating_and_stays_on_while_it_earns():
    c = SpeculationController()
    assert c.wanted(M, 0.0)
    assert feed(c, [stock()] * rules.STOCK_ANSWERS) == [None] * (rules.STOCK_ANSWERS - 1) + [1.0]
    speedups = feed(c, [drafted(2.0)] * rules.JUDGE_ANSWERS)
    assert speedups == [2.0] * rules.JUDGE_ANSWERS  # each answer's own, against the stock speed
    assert c.wanted(M, 1.0)
    figures = c.describe(M)
    assert figures["reason"].startswith("on: 2.00x") and figures["acceptance_rate"] == 0.75
    assert figures["stock_tokens_per_second"] == 50.0 and figures["drafting_tokens_per_second"] == 100.0
    # Over all its answers: those that drafted nothing took what they would have taken without it.
    plain_ms, drafting_ms = rules.STOCK_ANSWERS * 2000, rules.JUDGE_ANSWERS * 1000
    assert figures["speedup"] == round((2 * drafting_ms + plain_ms) / (drafting_ms + plain_ms), 3)


def test_speculation_that_loses_is_turned_off_and_tried_again_after_a_growing_cooldown():
    c = SpeculationController()
    feed(c, [stock()] * rules.STOCK_ANSWERS)
    feed(c, [drafted(0.8)] * rules.JUDGE_ANSWERS, now=100.0)
    assert not c.wanted(M, 100.0) and "0.80x" in c.describe(M)["reason"]
    assert not c.wanted(M, 100.0 + rules.COOLDOWN_S - 1)
    assert c.wanted(M, 100.0 + rules.COOLDOWN_S)  # a trial: the workload may have changed
    start = 100.0 + rules.COOLDOWN_S
    feed(c, [drafted(0.8)] * rules.JUDGE_ANSWERS, now=start)
    assert not c.wanted(M, start + 2 * rules.COOLDOWN_S - 1)  # a second loss in a row: twice as long
    assert c.wanted(M, start + 2 * rules.COOLDOWN_S)


def test_a_loss_within_the_margin_keeps_it_on():
    c = SpeculationController()
    feed(c, [stock()] * rules.STOCK_ANSWERS)
    feed(c, [drafted(rules.LOSES_BELOW + 0.01)] * rules.JUDGE_ANSWERS)
    assert c.wanted(M, 0.0)


def test_nothing_is_judged_on_short_answers_or_too_few_tokens():
    c = SpeculationController()
    feed(c, [stock()] * rules.STOCK_ANSWERS)
    short = Answer(rules.MIN_TOKENS - 1, 1000.0, drafted=10, accepted=0)  # very slow, but too short to time
    assert feed(c, [short] * 20) == [None] * 20
    assert c.wanted(M, 0.0) and c.describe(M)["draft_tokens"] == 200  # counted all the same
    few = rules.JUDGE_TOKENS // (rules.JUDGE_ANSWERS + 1)
    feed(c, [drafted(0.5, tokens=max(rules.MIN_TOKENS, few // 2))] * rules.JUDGE_ANSWERS)
    assert c.wanted(M, 0.0)  # answers enough, tokens not yet


def test_when_every_answer_drafts_the_stock_speed_is_measured_with_speculation_off():
    """A draft model drafts on every token: no answer shows the stock speed unless speculation is off
    for a few answers; the answers that drafted are judged once it is known."""
    c = SpeculationController()
    feed(c, [drafted(0.7)] * (rules.PROBE_AFTER - 1))
    assert c.wanted(M, 0.0)  # answers that draft nothing may still show it
    feed(c, [drafted(0.7)])
    assert not c.wanted(M, 0.0) and "stock speed" in c.describe(M)["reason"]
    feed(c, [drafted(0.7)])  # the speculating engine's last answer before its restart: not evidence
    feed(c, [stock()] * (rules.PROBE_ANSWERS - 1), speculating=False)
    assert not c.wanted(M, 0.0)
    feed(c, [stock()], now=50.0, speculating=False)  # the probe is complete: the drafts lose
    assert not c.wanted(M, 50.0) and "0.70x" in c.describe(M)["reason"]
    assert c.wanted(M, 50.0 + rules.COOLDOWN_S)


def test_a_forced_engine_is_measured_but_never_switched():
    c = SpeculationController()
    feed(c, [stock()] * rules.STOCK_ANSWERS, speculating=False, switchable=False)
    feed(c, [drafted(0.5)] * rules.JUDGE_ANSWERS, switchable=False)
    assert c.wanted(M, 0.0) and c.describe(M)["speedup"] == 0.5


def test_answers_of_an_engine_turned_off_do_not_count_for_the_next_trial():
    c = SpeculationController()
    feed(c, [stock()] * rules.STOCK_ANSWERS)
    feed(c, [drafted(0.8)] * rules.JUDGE_ANSWERS)
    feed(c, [drafted(0.1)] * 10)  # still speculating until its restart
    assert c.wanted(M, rules.COOLDOWN_S)
    feed(c, [drafted(1.5)] * rules.JUDGE_ANSWERS, now=rules.COOLDOWN_S)
    assert c.wanted(M, rules.COOLDOWN_S) and "1.50x" in c.describe(M)["reason"]


def test_probability_requests_hold_it_off_and_a_request_can_start_a_trial():
    c = SpeculationController()
    assert c.hold_off(M, "off: probabilities", now=10.0)
    assert not c.hold_off(M, "off: probabilities", now=20.0)  # already off: renewed, not changed
    assert not c.wanted(M, 20.0 + rules.PROBABILITY_HOLD_S - 1)
    assert c.wanted(M, 20.0 + rules.PROBABILITY_HOLD_S)
    c.hold_off(M, "off", now=0.0)
    assert c.try_on(M, "trial: asked") and c.wanted(M, 1.0) and not c.try_on(M, "again")


@pytest.mark.parametrize(("body", "reads"), [
    ({"logprobs": True, "top_logprobs": 2}, True), ({"logprobs": 3}, True), ({"n_probs": 5}, True),
    ({"logprobs": False}, False), ({"top_logprobs": 0}, False), ({"n_probs": 0}, False), ({}, False), (None, False),
])
def test_which_requests_read_token_probabilities(body, reads):
    assert wants_probabilities(body) is reads


def test_answer_figures_come_from_llama_server_timings():
    assert Answer.from_timings({"predicted_n": 40, "predicted_ms": 800.0}) == Answer(40, 800.0, 0, 0)
    assert Answer.from_timings({"predicted_n": 40, "predicted_ms": 800, "draft_n": 30, "draft_n_accepted": 12}) \
        == Answer(40, 800.0, 30, 12)
    assert Answer.from_timings({"prompt_n": 3}) is None and Answer.from_timings(None) is None
