"""The operations a job step may run, on this server's own code paths (docs/dev/job-system.md).

Each op takes the step's resolved `params` in the shape of the matching HTTP request and does what
that request does: `load` is `/v1/load` (same options, same checks), `chat` is a non-streamed
`/v1/chat/completions` through the proxy and the router (so its engine request is cancelled the
way a departing client's is), `models` is `/v1/models[/{id}]`, `system_info`/`system_stats` their
endpoints, `sleep` waits. `load`, `unload` and `chat` are exclusive: the job holds the router's gate.

This side also keeps which model residencies a job created (its own `load` made them), so an
interrupt unloads exactly those and a resume reloads them (`reconcile` / `restore`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import ValidationError

from lemonade.api.errors import describe_validation_error
from lemonade.api.lemonade.protocol import LoadRequest
from lemonade.api.openai.protocol import ChatCompletionRequest, legacy_max_tokens
from lemonade.catalog.catalog import NotFound
from lemonade.errors import APIError
from lemonade.jobs.manager import Op, Owned, RunState
from lemonade.runtime.exclusive import ExclusiveGate
from lemonade.runtime.request_context import ClientGone
from lemonade.services import Services
from lemonade.serving.chat import CHAT_PATH, ENDPOINT, chat_model
from lemonade.serving.load import prepare_load
from lemonade.serving.models import component_names, model_object, resolve
from lemonade.system.info import system_info, system_stats

log = logging.getLogger("lemonade.jobs")
PENDING_LOAD_WAIT_SECONDS = 600.0


def _invalid(exc: ValidationError, op: str) -> APIError:
    message, _ = describe_validation_error(exc.errors())
    return APIError(400, f"{op} params: {message}", code="invalid_argument")


class ServerOps:
    """The op table and model-side hooks of the job engine, over one server's Services."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    @property
    def gate(self) -> ExclusiveGate:
        return self.svc.router.gate

    def ops(self) -> dict[str, Op]:
        return {"system_info": Op(self.system_info), "system_stats": Op(self.system_stats),
                "models": Op(self.models), "sleep": Op(self.sleep),
                "load": Op(self.load, exclusive=True), "unload": Op(self.unload, exclusive=True),
                "chat": Op(self.chat, exclusive=True)}

    def drained(self) -> bool:
        return self.svc.router.drained()

    def resident_pins(self) -> dict[str, bool]:
        return self.svc.router.pinned_states()

    def canonical(self, name: str) -> str | None:
        try:
            return self.svc.catalog.resolve(name).name
        except NotFound:
            return None

    # ----- read-only ops ----------------------------------------------------------------------
    async def system_info(self, params: dict[str, Any], state: RunState) -> Any:
        recipes = await asyncio.to_thread(self.svc.engines.system_info)
        return system_info(self.svc.catalog.hub_cache(), recipes)

    async def system_stats(self, params: dict[str, Any], state: RunState) -> Any:
        return await asyncio.to_thread(system_stats)

    async def models(self, params: dict[str, Any], state: RunState) -> Any:
        if "id" in params:
            model = resolve(self.svc, params["id"])
            return model_object(self.svc, model, with_components=True)
        data = [model_object(self.svc, m) for m in self.svc.catalog.all()]
        return {"object": "list", "data": [m for m in data if params.get("show_all") or m["downloaded"]]}

    async def sleep(self, params: dict[str, Any], state: RunState) -> Any:
        ms = params.get("ms", 0)
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise APIError(400, f"sleep params.ms must be a number of milliseconds >= 0 (got {ms!r})")
        if state.cancel.is_set():
            raise ClientGone()
        wake = asyncio.get_running_loop().create_future()

        def on_cancel() -> None:
            if not wake.done():
                wake.set_result(None)

        state.cancel.add(on_cancel)
        try:
            await asyncio.wait_for(asyncio.shield(wake), ms / 1000)
        except TimeoutError:
            return {}
        finally:
            state.cancel.discard(on_cancel)
        raise ClientGone()  # interrupted

    # ----- exclusive ops ----------------------------------------------------------------------
    def _load_names(self, params: dict[str, Any]) -> tuple[LoadRequest, list[str]]:
        try:
            body = LoadRequest.model_validate({k: v for k, v in params.items() if k != "stream"})
        except ValidationError as exc:
            raise _invalid(exc, "load") from None
        model = resolve(self.svc, body.model_name)
        names = component_names(self.svc, model) if model.is_collection else [model.name]
        return body, names

    async def load(self, params: dict[str, Any], state: RunState) -> Any:
        """`/v1/load` with these params; the residency it creates becomes the job's."""
        body, names = self._load_names(params)
        router = self.svc.router
        before = {n: router.resident(n, usable=False) for n in names}
        work = prepare_load(self.svc, body.model_name, body.model_extra or {}, pinned=body.pinned,
                            save_options=body.save_options)
        try:
            await work()
        except (ClientGone, asyncio.CancelledError):
            for n in names:  # the load goes on in the router; what it creates is still this job's
                state.pending_loads[n] = (before[n], params)
            raise
        for n in names:
            lm = router.resident(n, usable=False)
            own = state.owned.get(n)
            if lm is not None and (lm is not before[n] or (own is not None and own.instance is lm)):
                state.owned[n] = Owned(params=params, instance=lm)
        lm = router.resident(names[0], usable=False) if names else None
        out: dict[str, Any] = {"loaded": lm is not None, "model": body.model_name}
        if lm is not None:
            out["backend"] = lm.backend
            if lm.context_length is not None:
                out["ctx_size"] = lm.context_length
        return out

    async def unload(self, params: dict[str, Any], state: RunState) -> Any:
        name = params.get("model_name", params.get("model"))
        if name is None:
            await self.svc.router.unload(None)
            state.owned.clear()
            return {}
        if not isinstance(name, str) or not name:
            raise APIError(400, f"unload params.model must be a model name (got {name!r}); omit it to unload all")
        model = self.svc.catalog.find(name)
        names = [model.name] if model is not None and not model.is_collection else \
            component_names(self.svc, model) if model is not None else [name]
        for n in names:
            await self.svc.router.unload(n)
            state.owned.pop(n, None)
        return {}

    async def chat(self, params: dict[str, Any], state: RunState) -> Any:
        """A non-streamed chat completion; the engine's answer verbatim (`timings`, `usage`)."""
        try:
            body = ChatCompletionRequest.model_validate({k: v for k, v in params.items()
                                                         if k not in ("stream", "stream_options")})
        except ValidationError as exc:
            raise _invalid(exc, "chat") from None
        model = chat_model(self.svc, body.model, "/chat/completions")
        payload = body.model_dump(exclude_unset=True)
        legacy_max_tokens(payload)
        return await self.svc.proxy.post_json(model, CHAT_PATH, payload, ENDPOINT)

    # ----- the job's residencies: interrupt and resume ------------------------------------------
    async def reconcile(self, state: RunState) -> None:
        """Unload the residencies the job created (remembering how to reload them), leave every other
        model alone, and give models that were resident before the job their pin state back."""
        router = self.svc.router
        for name, (before, params) in list(state.pending_loads.items()):
            waited = 0.0
            while name in router.queue_info()["loading"] and waited < PENDING_LOAD_WAIT_SECONDS:
                await asyncio.sleep(0.1)
                waited += 0.1
            lm = router.resident(name, usable=False)
            if lm is not None and lm is not before:
                state.owned[name] = Owned(params=params, instance=lm)
        state.pending_loads.clear()
        for name, own in list(state.owned.items()):
            if own.instance is None:
                continue
            current = router.resident(name, usable=False)
            if current is not None and current is own.instance:
                own.pinned = current.pinned
                own.instance = None
                await router.unload(name)
                log.info("Unloaded %s: the interrupted job had loaded it", name)
            else:
                del state.owned[name]  # replaced or unloaded by someone else: no longer the job's
        for name, pinned in (state.snapshot or {}).items():
            lm = router.resident(name, usable=False)
            if lm is not None and lm.pinned != pinned:
                router.pin(name, pinned)

    async def restore(self, state: RunState, manifest: dict[str, dict[str, Any]]) -> None:
        """Before a resumed job goes on: reload what an interrupt unloaded (or, after a restart, what
        its completed load steps left resident). A model someone else loaded meanwhile is adopted
        as it is and is no longer the job's. A failed reload only logs: the step that needs the
        model fails in its turn."""
        router = self.svc.router
        wanted = {n: own.params for n, own in state.owned.items() if own.instance is None}
        wanted.update({n: p for n, p in manifest.items() if n not in state.owned})
        for name, params in wanted.items():
            if router.resident(name, usable=False) is not None:
                state.owned.pop(name, None)
                continue
            state.owned.pop(name, None)
            try:
                await self.load(params, state)
                log.info("Reloaded %s for the resumed job", name)
            except ClientGone:
                raise
            except Exception as exc:
                log.warning("Could not reload %s for the resumed job: %s", name, exc)
