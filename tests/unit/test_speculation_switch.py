"""Carrying out speculation verdicts (runtime/speculation_switch.py) with the real router and the
engine stand-in (tests/standin): when a model is started again, with which options, and when not.
The answers' figures are given here (the stand-in drafts nothing); that the real llama-server's
reach the controller, and what a user sees, is tests/test_speculative.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lemonade.backends.engine import Speculation
from lemonade.backends.llamacpp.spec import NGRAM_ARGS
from lemonade.errors import APIError
from lemonade.runtime import speculation as rules
from lemonade.runtime import speculation_switch
from lemonade.runtime.speculation_switch import SpeculationSwitch
from tests.unit.standin_world import model, router, run, until

M = model("m")
AUTO = {"speculation": "auto"}


def world(tmp_path) -> tuple[Any, Any, SpeculationSwitch]:
    r, engine = router(tmp_path)
    switch = SpeculationSwitch(r)
    engine.speculation_wanted = switch.wanted  # as services passes it in
    return r, engine, switch


def answer(tokens: int, ms: float, drafted: int = 0) -> dict[str, Any]:
    """An answer's body as llama-server ends it: its `timings`."""
    return {"timings": {"predicted_n": tokens, "predicted_ms": ms,
                        **({"draft_n": drafted, "draft_n_accepted": drafted // 2} if drafted else {})}}


def running(r) -> str | None:
    return r.resident(M.name).launch.speculation.kind


def test_a_changed_verdict_restarts_the_model_with_its_own_options_once_it_is_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(speculation_switch, "IDLE_GRACE_S", 0.05)
    r, engine, switch = world(tmp_path)

    async def scenario() -> tuple[list[str], list[str], str | None, dict[str, Any]]:
        try:
            await r.ensure_loaded(M, {**AUTO, "ctx_size": 2048})
            for _ in range(rules.STOCK_ANSWERS):
                switch.after(M, answer(100, 2000.0))
            async with r.use(M, {}):  # busy while the verdict turns: drafts that make it slower
                for _ in range(rules.JUDGE_ANSWERS):
                    switch.after(M, answer(100, 4000.0, drafted=90))
                await asyncio.sleep(0.3)  # many times the grace: a restart under a request would show
                while_busy = list(engine.launches)
            await until(lambda: r.resident(M.name) is not None and len(engine.launches) == 2)
            return while_busy, list(engine.launches), running(r), r.resident(M.name).options
        finally:
            await switch.close()
            await r.shutdown()

    while_busy, launches, kind, options = run(scenario)
    assert while_busy == [M.name]  # never under a running request
    assert launches == [M.name, M.name] and kind is None
    assert options["ctx_size"] == 2048 and options["speculation"] == "auto"  # its own options, started again


def test_a_request_reading_probabilities_is_served_by_an_engine_without_speculation(tmp_path):
    r, engine, switch = world(tmp_path)

    async def scenario() -> tuple[str | None, str | None, int, bool]:
        try:
            await r.ensure_loaded(M, AUTO)
            before = running(r)
            await switch.before(M, {"messages": [], "logprobs": True, "top_logprobs": 2}, AUTO)
            after = running(r)
            await switch.before(M, {"messages": [], "logprobs": True}, AUTO)  # already as needed
            return before, after, len(engine.launches), switch.wanted(M.name)
        finally:
            await r.shutdown()

    before, after, launches, wanted = run(scenario)
    assert before == NGRAM_ARGS[1] and after is None and launches == 2
    assert not wanted  # and it stays off for a while


def test_a_request_field_forces_it_either_way_and_is_not_sent_on(tmp_path):
    r, engine, switch = world(tmp_path)
    off = {"speculation": "off"}  # the model's options force it off

    async def scenario() -> list[tuple[str | None, str]]:
        try:
            await r.ensure_loaded(M, off)
            seen = [(running(r), r.resident(M.name).options["speculation"])]
            body = {"messages": [], "speculation": "on"}
            await switch.before(M, body, off)
            assert "speculation" not in body
            seen.append((running(r), r.resident(M.name).options["speculation"]))  # loaded as /v1/load would
            await switch.before(M, {"speculation": "off"}, off)
            seen.append((running(r), r.resident(M.name).options["speculation"]))
            await switch.before(M, {"logprobs": True}, off)  # off already: nothing to do
            return seen
        finally:
            await r.shutdown()

    assert run(scenario) == [(None, "off"), (NGRAM_ARGS[1], "on"), (None, "off")]
    assert len(engine.launches) == 3


def test_what_the_switch_leaves_alone(tmp_path):
    r, engine, switch = world(tmp_path)

    async def scenario() -> None:
        try:
            lm = await r.ensure_loaded(M, {"speculation": "on"})
            await switch.before(M, {"logprobs": True}, {"speculation": "on"})  # forced on: the user chose it
            lm.launch.speculation = Speculation("ngram-mod", "args")  # the user's own --spec-type
            await switch.before(M, {"speculation": "off", "logprobs": True}, {})
            with pytest.raises(APIError) as err:
                await switch.before(M, {"speculation": "sometimes"}, {})
            assert err.value.status == 400 and "'speculation' must be one of auto, on, off" in err.value.message
        finally:
            await r.shutdown()

    run(scenario)
    assert engine.launches == [M.name]


def test_a_model_not_loaded_is_loaded_once_as_the_request_needs(tmp_path):
    r, engine, switch = world(tmp_path)

    async def scenario() -> list[str | None]:
        try:
            await switch.before(M, {"logprobs": True}, lambda: AUTO)
            kinds = [running(r)]
            await r.unload(M.name)
            await switch.before(M, {"speculation": "on"}, {"speculation": "off"})
            return [*kinds, running(r)]
        finally:
            await r.shutdown()

    assert run(scenario) == [None, NGRAM_ARGS[1]]
    assert engine.launches == [M.name, M.name]  # one load each, not a load and a reload
