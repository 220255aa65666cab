"""Speculative decoding switched on by what it earns: the per-model controller (pure rules, no I/O).

A model whose `speculation` option is `auto` starts with speculation on (backends/llamacpp/spec.py
picks the kind). Every answer llama-server gives reports its own figures (`timings`: tokens
generated and the milliseconds they took, tokens drafted and accepted); `observe()` reads them:

- answers that drafted nothing run at the model's stock speed (n-gram speculation drafts only
  where text repeats; an engine without speculation never drafts): they keep the stock
  milliseconds per token (`STOCK_WEIGHT`, a moving average);
- answers that drafted are measured against it: their speed-up is the time the stock engine would
  have taken for their tokens over the time they took. Once `JUDGE_ANSWERS` of them hold
  `JUDGE_TOKENS` tokens, the speed-up of the lot decides: below `LOSES_BELOW` speculation is turned
  off for the model, for a cooldown that doubles with each loss in a row (`COOLDOWN_S` to
  `MAX_COOLDOWN_S`); then it is tried again, so a workload that changes is measured again;
- when every answer drafts (a draft model speculates on every token; an edit-only workload), the
  stock speed is measured after `PROBE_AFTER` of them by turning speculation off for
  `PROBE_ANSWERS` answers, then on again.

Answers shorter than `MIN_TOKENS` are counted (drafted, accepted) but not timed: their few
milliseconds say more about the machine than about speculation. A request that reads token
probabilities (`logprobs`, `n_probs`) is a kind of request speculation costs something: llama-server
gives no probabilities for the tokens it accepted from a draft. So it turns speculation off for the
model for `PROBABILITY_HOLD_S` (renewed by each such request), and so does a request asking for
`speculation: off`; `speculation: on` starts a trial. The verdict is per model: the pinned
llama-server cannot switch speculation per request, so a changed verdict takes effect when the
model is started again (runtime/speculation_switch.py does that while the model is idle).

Nothing here reads a clock or the network: `now` is passed in, so the rules are tested in
milliseconds (tests/unit/test_speculation_rules.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

MIN_TOKENS = 32  # answers shorter than this are not timed
STOCK_WEIGHT = 0.25  # weight of a new answer in the stock ms/token average
STOCK_ANSWERS = 3  # answers that drafted nothing before the stock speed counts as known
JUDGE_ANSWERS = 6  # answers that drafted, ...
JUDGE_TOKENS = 512  # ... holding this many tokens, before speculation is judged
LOSES_BELOW = 0.95  # speed-up under which speculation is turned off (a margin for a shared machine's noise)
PROBE_AFTER = 2 * JUDGE_ANSWERS  # answers that drafted, none showing the stock speed, before it is measured ...
PROBE_ANSWERS = 3  # ... with speculation off for this many answers
COOLDOWN_S = 600.0  # off after a loss for this long, doubled per loss in a row, ...
MAX_COOLDOWN_S = 6 * 3600.0  # ... up to this
PROBABILITY_HOLD_S = 600.0  # off this long after a request that reads token probabilities (or asks off)


def wants_probabilities(body: dict[str, Any] | None) -> bool:
    """Does a request (as sent to llama-server) read token probabilities?"""
    if not isinstance(body, dict):
        return False
    return bool(body.get("logprobs")) or _positive(body.get("top_logprobs")) or _positive(body.get("n_probs"))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@dataclass
class Answer:
    """One answer's figures, from llama-server's `timings`."""

    tokens: int  # predicted_n
    ms: float  # predicted_ms
    drafted: int = 0  # draft_n (absent: nothing drafted)
    accepted: int = 0  # draft_n_accepted

    @classmethod
    def from_timings(cls, timings: Any) -> Answer | None:
        if not isinstance(timings, dict):
            return None
        tokens, ms = timings.get("predicted_n"), timings.get("predicted_ms")
        if not isinstance(tokens, int) or not isinstance(ms, (int, float)):
            return None
        drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
        return cls(tokens, float(ms), drafted if isinstance(drafted, int) else 0,
                   accepted if isinstance(accepted, int) else 0)

    @property
    def timed(self) -> bool:
        return self.tokens >= MIN_TOKENS and self.ms > 0


@dataclass
class Judgement:
    """Timed answers that drafted, since speculation was last judged."""

    answers: int = 0
    tokens: int = 0
    ms: float = 0.0
    stock_ms: float = 0.0  # what their tokens take at the stock speed, ...
    unpriced: int = 0  # ... but for these tokens, seen before the stock speed was known

    def add(self, answer: Answer, stock_ms_per_token: float | None) -> None:
        self.answers += 1
        self.tokens += answer.tokens
        self.ms += answer.ms
        if stock_ms_per_token is None:
            self.unpriced += answer.tokens
        else:
            self.stock_ms += answer.tokens * stock_ms_per_token

    @property
    def ready(self) -> bool:
        return self.answers >= JUDGE_ANSWERS and self.tokens >= JUDGE_TOKENS

    def speedup(self, stock_ms_per_token: float) -> float:
        return (self.stock_ms + self.unpriced * stock_ms_per_token) / self.ms


@dataclass
class ModelSpeculation:
    """What speculation earns one model, and whether it should speculate (for `auto`)."""

    wanted: bool = True
    reason: str = "trial: measuring what speculation earns"
    off_until: float = 0.0  # while `wanted` is False: when to try again
    losses: int = 0  # losses in a row (the cooldown doubles with each)
    probing: int = 0  # answers left to measure the stock speed with speculation off
    stock_ms_per_token: float | None = None
    stock_answers: int = 0
    judgement: Judgement = field(default_factory=Judgement)
    # Running totals of answers from a speculating engine, for /v1/stats and /metrics: all of them,
    # and the timed ones (those that drafted: their tokens and time; the others: their time).
    answers: int = 0
    drafted: int = 0
    accepted: int = 0
    drafting_tokens: int = 0
    drafting_ms: float = 0.0
    plain_ms: float = 0.0

    @property
    def stock(self) -> float | None:
        """Stock milliseconds per token, once enough answers showed it."""
        return self.stock_ms_per_token if self.stock_answers >= STOCK_ANSWERS else None

    def speedup(self) -> float | None:
        """Generation with speculation over the stock speed, over every timed answer of a speculating
        engine: the stock time of the tokens of answers that drafted, plus the time of those that did
        not (speculation changed nothing for them), over the time they all took."""
        took = self.drafting_ms + self.plain_ms
        if self.stock is None or took <= 0:
            return None
        return round((self.drafting_tokens * self.stock + self.plain_ms) / took, 3)

    def acceptance(self) -> float | None:
        return round(self.accepted / self.drafted, 4) if self.drafted else None

    def describe(self) -> dict[str, Any]:
        took = self.drafting_ms + self.plain_ms
        return {
            "wanted": self.wanted, "reason": self.reason, "requests": self.answers,
            "draft_tokens": self.drafted, "draft_accepted_tokens": self.accepted,
            "acceptance_rate": self.acceptance(), "speedup": self.speedup(),
            "stock_tokens_per_second": round(1000 / self.stock, 2) if self.stock else None,
            "drafting_tokens_per_second": round(self.drafting_tokens / self.drafting_ms * 1000, 2)
            if self.drafting_ms > 0 else None,
            "timed_seconds": round(took / 1000, 3),
        }


class SpeculationController:
    """Per model: what speculation earns, and the verdict for models whose option is `auto`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, ModelSpeculation] = {}

    def _model(self, name: str) -> ModelSpeculation:
        state = self._models.get(name)
        if state is None:
            state = self._models[name] = ModelSpeculation()
        return state

    def wanted(self, name: str, now: float) -> bool:
        """Should `name` (option `auto`) speculate when it starts? A cooldown that ran out starts a trial."""
        with self._lock:
            state = self._model(name)
            if not state.wanted and not state.probing and now >= state.off_until:
                self._turn_on(state, "trial: measuring what speculation earns again")
            return state.wanted

    def observe(self, name: str, answer: Answer, speculating: bool, switchable: bool,
                now: float) -> float | None:
        """Take one answer of `name`'s engine (`speculating`: it runs speculative decoding;
        `switchable`: its option is `auto`). Returns the answer's measured speed-up, when it can be
        told: a timed answer of a speculating engine (1.0 when it drafted nothing), the stock speed known."""
        with self._lock:
            state = self._model(name)
            if speculating:
                state.answers += 1
                state.drafted += answer.drafted
                state.accepted += answer.accepted
            if not answer.timed:
                return None
            speedup = None
            if answer.drafted == 0:
                self._learn_stock(state, answer)
                if speculating:
                    state.plain_ms += answer.ms
                    speedup = 1.0 if state.stock is not None else None
                if state.probing and not speculating:
                    state.probing -= 1
                    if not state.probing:  # back on, and the answers that drafted are judged now
                        state.wanted, state.reason = True, "trial: stock speed measured"
            elif speculating:
                state.drafting_tokens += answer.tokens
                state.drafting_ms += answer.ms
                if state.stock is not None:
                    speedup = round(answer.tokens * state.stock / answer.ms, 3)
                if state.wanted or not switchable:  # not the last answers of an engine turned off
                    state.judgement.add(answer, state.stock)
            self._judge(state, now, act=switchable)
            return speedup

    def hold_off(self, name: str, reason: str, now: float, seconds: float = PROBABILITY_HOLD_S) -> bool:
        """Turn `name`'s speculation off for `seconds` (a request that reads token probabilities, or
        asks for `speculation: off`). Returns whether the verdict changed."""
        with self._lock:
            state = self._model(name)
            changed = state.wanted
            state.wanted, state.reason, state.probing = False, reason, 0
            state.off_until = max(state.off_until, now + seconds)
            return changed

    def try_on(self, name: str, reason: str) -> bool:
        """Start a trial now (a request asking for `speculation: on`). Returns whether it changed."""
        with self._lock:
            state = self._model(name)
            changed = not state.wanted
            if changed:
                self._turn_on(state, reason)
            return changed

    def describe(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            state = self._models.get(name)
            return state.describe() if state is not None else None

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {name: state.describe() for name, state in self._models.items()}

    # ----- rules ------------------------------------------------------------------------------------
    @staticmethod
    def _learn_stock(state: ModelSpeculation, answer: Answer) -> None:
        sample = answer.ms / answer.tokens
        previous = state.stock_ms_per_token
        state.stock_ms_per_token = sample if previous is None else previous + STOCK_WEIGHT * (sample - previous)
        state.stock_answers += 1

    @staticmethod
    def _turn_on(state: ModelSpeculation, reason: str) -> None:
        state.wanted, state.reason, state.probing, state.off_until = True, reason, 0, 0.0
        state.judgement = Judgement()

    def _judge(self, state: ModelSpeculation, now: float, act: bool) -> None:
        """Judge the answers that drafted once there are enough; `act`: the verdict follows (`auto`)."""
        judgement = state.judgement
        if not judgement.ready or act and not state.wanted:
            return
        stock = state.stock
        if stock is None:  # no answer showed the stock speed yet: wait for some, then measure it
            if act and judgement.answers >= PROBE_AFTER:
                state.wanted, state.probing = False, PROBE_ANSWERS
                state.reason = "measuring the stock speed without speculation"
            return
        speedup = judgement.speedup(stock)
        state.judgement = Judgement()
        if not act:
            return
        if speedup < LOSES_BELOW:
            cooldown = min(MAX_COOLDOWN_S, COOLDOWN_S * 2 ** state.losses)
            state.losses += 1
            state.wanted, state.off_until = False, now + cooldown
            state.reason = f"off: {speedup:.2f}x the stock speed (tried again in {cooldown / 60:.0f} min)"
        else:
            state.losses = 0
            state.reason = f"on: {speedup:.2f}x the stock speed"
