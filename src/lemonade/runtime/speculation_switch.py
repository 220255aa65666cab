"""Carrying out speculation verdicts (runtime/speculation.py) on running engines.

The pinned llama-server switches speculative decoding only when it starts, so a verdict that differs
from what a model's engine runs is carried out by starting the model again, with its running
options, through the router (as a `/v1/load` with other options is):

- after an answer (`after`): the controller reads the engine's figures; a model whose option is
  `auto` and whose verdict changed is restarted once it has been idle for `IDLE_GRACE_S`, so no
  request waits for it and no answer is cut;
- before a request (`before`) that cannot be served as asked by the engine as it runs: one that reads
  token probabilities (llama-server gives none for drafted tokens) or asks for `"speculation": "off"`
  from a speculating engine, or `"on"` from one that does not. The model is started again the way the
  request needs (in-flight requests finish first) and the request is served by the new engine. For
  `auto` that is the controller's verdict (off for a while; on as a trial); a model forced `on` or `off`
  by its options is loaded with the request's value as a load option (the load request's layer of
  runtime/options.py); a `--spec-type` of the user's own in `llamacpp_args` is never changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from lemonade.backends.llamacpp.settings import SPECULATION_MODES
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.router import LoadedModel, Router
from lemonade.runtime.router.state import Options
from lemonade.runtime.speculation import Answer, SpeculationController, wants_probabilities

log = logging.getLogger("lemonade.speculation")
IDLE_GRACE_S = 2.0  # an idle model is restarted for a new verdict only after this long without requests
FIELD = "speculation"  # the request field: auto, on or off


class SpeculationSwitch:
    def __init__(self, router: Router, controller: SpeculationController | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router
        self.controller = controller or SpeculationController()
        self.clock = clock
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._public: dict[str, str] = {}  # model name -> the name it is shown by

    def wanted(self, name: str) -> bool:
        """The verdict an engine reads when `name` (option `auto`) starts."""
        return self.controller.wanted(name, self.clock())

    # ----- before a request ---------------------------------------------------------------------------
    async def before(self, model: ModelInfo, body: dict[str, Any], options: Options) -> None:
        """Take the request's `speculation` field out of `body` (400 for a bad value) and make sure the
        engine that serves the request speculates or not as the request needs."""
        value = body.pop(FIELD, None)
        if value is not None and value not in SPECULATION_MODES:
            raise APIError(400, f"'{FIELD}' must be one of {', '.join(SPECULATION_MODES)}, got {value!r}",
                           code="invalid_argument")
        explicit = value in ("on", "off")
        if not explicit and not wants_probabilities(body):
            return
        if FIELD not in self.router.engine_for(model).options:  # an engine without speculative decoding
            return
        need = value == "on"
        lm = self.router.resident(model.name)
        if lm is None:  # the load this request causes is made as it needs
            opts = dict(options() if callable(options) else options)
            if opts.get(FIELD, "auto") == "auto":
                self._steer(model.name, need, value)
            elif explicit:
                opts[FIELD] = value
            lm = await self.router.ensure_loaded(model, opts)
        running = lm.launch.speculation
        if (running.kind is not None) == need or running.mode == "args" or not (explicit or running.switchable):
            return  # as needed; the user's own --spec-type; probabilities asked of a model forced on
        if running.switchable:
            self._steer(model.name, need, value)
            reason = f"asks for speculation {value}" if explicit else "reads token probabilities"
            log.info("A request to %s %s: restarting it %s speculative decoding", model.public, reason,
                     "with" if need else "without")
            await self.router.ensure_loaded(model, dict(lm.options), reload=True)
        else:
            log.info("A request to %s asks for speculation %s: loading it so", model.public, value)
            await self.router.ensure_loaded(model, {**lm.options, FIELD: value}, reload=True)

    def _steer(self, name: str, need: bool, value: str | None) -> None:
        now = self.clock()
        if need:
            self.controller.try_on(name, "trial: a request asked for speculation on")
        else:
            self.controller.hold_off(name, "off: a request asked for speculation off" if value == "off" else
                                     "off: requests read token probabilities, which drafted tokens lack", now)

    # ----- after an answer ----------------------------------------------------------------------------
    def after(self, model: ModelInfo, answer_body: Any) -> float | None:
        """Take an answer's figures; returns its measured speed-up (None when it cannot be told)."""
        answer = Answer.from_timings(answer_body.get("timings") if isinstance(answer_body, dict) else None)
        lm = self.router.resident(model.name)
        if answer is None or lm is None:
            return None
        self._public[model.name] = model.public
        running = lm.launch.speculation
        speedup = self.controller.observe(model.name, answer, running.kind is not None, running.switchable,
                                          self.clock())
        if running.switchable and self.wanted(model.name) != (running.kind is not None) \
                and model.name not in self._pending:
            self._pending[model.name] = asyncio.ensure_future(self._switch_when_idle(lm))
        return speedup

    async def _switch_when_idle(self, lm: LoadedModel) -> None:
        try:
            while True:
                await lm.idle.wait()
                await asyncio.sleep(IDLE_GRACE_S)
                if self.router.resident(lm.name) is not lm:
                    return  # unloaded or restarted meanwhile: that start asked the controller already
                if lm.idle.is_set():
                    break
            if self.wanted(lm.name) == (lm.launch.speculation.kind is not None):
                return
            log.info("Speculative decoding of %s: %s; restarting it", lm.model.public,
                     self.controller.describe(lm.name)["reason"])  # type: ignore[index]
            await self.router.ensure_loaded(lm.model, dict(lm.options), reload=True)
        except Exception as exc:  # a failed start is the router's to report; the next request loads it again
            log.warning("Could not restart %s for speculative decoding: %s", lm.model.public, exc)
        finally:
            self._pending.pop(lm.name, None)

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ----- what it shows -------------------------------------------------------------------------------
    def describe(self) -> dict[str, dict[str, Any]]:
        """Per model (public name): what speculation earns it and what its engine runs, for /v1/stats
        and /metrics. Models seen by the controller and loaded models that speculate."""
        figures = self.controller.snapshot()
        loaded = {lm.name: lm for lm in self.router.models()}
        out: dict[str, dict[str, Any]] = {}
        for name in set(figures) | {n for n, lm in loaded.items() if lm.launch.speculation.kind is not None}:
            lm = loaded.get(name)
            running = lm.launch.speculation if lm is not None else None
            public = lm.model.public if lm is not None else self._public.get(name, name)
            out[public] = {"type": running.kind if running else None, "mode": running.mode if running else None,
                           **figures.get(name, {})}
        return out
