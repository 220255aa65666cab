"""Carrying out speculation verdicts (runtime/speculation_switch.py) against a stand-in router that
records the loads asked of it: when a model is started again, with which options, and when not.
The same paths on the real router and llama-server: tests/test_speculative.py."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from lemonade.backends.engine import Speculation
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime import speculation as rules
from lemonade.runtime import speculation_switch
from lemonade.runtime.speculation import SpeculationController
from lemonade.runtime.speculation_switch import SpeculationSwitch

MODEL = ModelInfo(name="user.M", recipe="llamacpp", mode="chat", labels=[])


@dataclass
class FakeLaunch:
    speculation: Speculation


@dataclass
class FakeLoaded:
    options: dict[str, Any]
    speculation: Speculation
    model: ModelInfo = field(default_factory=lambda: MODEL)
    usable: bool = True
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.launch = FakeLaunch(self.speculation)
        self.idle.set()

    @property
    def name(self) -> str:
        return self.model.name


class FakeEngine:
    def __init__(self, speculates: bool) -> None:
        self.options = {"speculation": None} if speculates else {}


class FakeRouter:
    """Loads start a model as an engine would: speculating per the options and the verdict."""

    def __init__(self, switch_verdict: Any = None, speculates: bool = True) -> None:
        self.loaded: dict[str, FakeLoaded] = {}
        self.loads: list[tuple[dict[str, Any], bool]] = []  # (options, reload)
        self.verdict = switch_verdict
        self.engine = FakeEngine(speculates)

    def engine_for(self, model: ModelInfo) -> FakeEngine:
        return self.engine

    def start(self, options: dict[str, Any]) -> FakeLoaded:
        mode = options.get("speculation", "auto")
        on = mode == "on" or mode == "auto" and self.verdict(MODEL.name)
        lm = FakeLoaded(dict(options), Speculation("ngram-map-k" if on else None, mode))
        self.loaded[MODEL.name] = lm
        return lm

    async def ensure_loaded(self, model: ModelInfo, options: Any, *, reload: bool = False) -> FakeLoaded:
        opts = options() if callable(options) else options
        self.loads.append((dict(opts), reload))
        current = self.loaded.get(model.name)
        if current is not None and not reload:
            return current
        if current is not None:
            current.usable = False
        return self.start(opts)


def synchronous(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test in its own event loop (fixtures still reach it by name)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


def switch_for(router: FakeRouter) -> SpeculationSwitch:
    clock = [1000.0]
    switch = SpeculationSwitch(router, SpeculationController(), clock=lambda: clock[0])  # type: ignore[arg-type]
    router.verdict = switch.wanted
    return switch


def timings(tokens: int, ms: float, drafted: int = 0) -> dict[str, Any]:
    return {"timings": {"predicted_n": tokens, "predicted_ms": ms, **({"draft_n": drafted, "draft_n_accepted": 0}
                                                                      if drafted else {})}}


@synchronous
async def test_a_changed_verdict_restarts_the_model_once_it_is_idle(monkeypatch):
    monkeypatch.setattr(speculation_switch, "IDLE_GRACE_S", 0.05)
    router = FakeRouter()
    switch = switch_for(router)
    lm = router.start({"speculation": "auto", "ctx_size": 4096})
    for _ in range(rules.STOCK_ANSWERS):
        switch.after(MODEL, timings(100, 2000.0))
    lm.idle.clear()  # busy: serving another request
    for _ in range(rules.JUDGE_ANSWERS):  # drafts that make it slower: the verdict turns off
        switch.after(MODEL, timings(100, 4000.0, drafted=90))
    await asyncio.sleep(0.2)
    assert router.loads == []  # never under a running request
    lm.idle.set()
    await asyncio.sleep(0.2)
    assert router.loads == [({"speculation": "auto", "ctx_size": 4096}, True)]  # its own options, started again
    assert router.loaded[MODEL.name].launch.speculation.kind is None
    await switch.close()


@synchronous
async def test_a_request_reading_probabilities_is_served_by_an_engine_without_speculation():
    router = FakeRouter()
    switch = switch_for(router)
    router.start({"speculation": "auto"})
    body = {"messages": [], "logprobs": True, "top_logprobs": 2}
    await switch.before(MODEL, body, {"speculation": "auto"})
    assert router.loads == [({"speculation": "auto"}, True)]
    assert router.loaded[MODEL.name].launch.speculation.kind is None
    assert not switch.wanted(MODEL.name)  # and it stays off for a while
    await switch.before(MODEL, dict(body), {"speculation": "auto"})
    assert len(router.loads) == 1  # already as needed


@synchronous
async def test_a_request_field_forces_it_either_way_and_is_not_sent_on():
    router = FakeRouter()
    switch = switch_for(router)
    router.start({"speculation": "off"})  # the model's options force it off
    body = {"messages": [], "speculation": "on"}
    await switch.before(MODEL, body, {"speculation": "off"})
    assert "speculation" not in body
    assert router.loads == [({"speculation": "on"}, True)]  # loaded with the request's value, as /v1/load would
    await switch.before(MODEL, {"speculation": "off"}, {"speculation": "off"})
    assert router.loads[-1] == ({"speculation": "off"}, True)
    before = len(router.loads)
    await switch.before(MODEL, {"logprobs": True}, {"speculation": "off"})  # off already
    assert len(router.loads) == before


@synchronous
async def test_what_the_switch_leaves_alone():
    router = FakeRouter()
    switch = switch_for(router)
    lm = router.start({"speculation": "auto"})
    lm.launch.speculation = Speculation("ngram-mod", "args")  # the user's own --spec-type
    await switch.before(MODEL, {"speculation": "off", "logprobs": True}, {})
    forced = FakeRouter()
    switch_forced = switch_for(forced)
    forced.start({"speculation": "on"})
    await switch_forced.before(MODEL, {"logprobs": True}, {"speculation": "on"})  # forced on: the user chose it
    other = FakeRouter(speculates=False)
    body = {"speculation": "off"}
    await switch_for(other).before(MODEL, body, {})  # an engine without speculative decoding
    assert router.loads == forced.loads == other.loads == [] and body == {}
    with pytest.raises(APIError) as err:
        await switch.before(MODEL, {"speculation": "sometimes"}, {})
    assert err.value.status == 400 and "'speculation' must be one of auto, on, off" in err.value.message


@synchronous
async def test_a_model_not_loaded_is_loaded_as_the_request_needs():
    router = FakeRouter()
    switch = switch_for(router)
    await switch.before(MODEL, {"logprobs": True}, lambda: {"speculation": "auto"})
    assert router.loads == [({"speculation": "auto"}, False)]
    assert router.loaded[MODEL.name].launch.speculation.kind is None
    forced = FakeRouter()
    await switch_for(forced).before(MODEL, {"speculation": "on"}, {"speculation": "off"})
    assert forced.loads == [({"speculation": "on"}, False)]  # one load, not two
