"""Routing a request that names a `collection.router` model: the member its policy (routing/) picks,
and the helper models the policy's model-backed conditions call.

Model-backed conditions call the policy's helper models through the same router and proxy as any
request: `classifier` a classification model (serving/classification.py, as `/v1/classify`), or a
chat model asked for label scores; `semantic_similarity` an embedding model; `llm` a chat model,
greedy and under the reply contract's JSON schema as a grammar (`response_format`), so even a small
model answers in contract and only chooses the label. Those calls are routing dependencies: the
router keeps their models in its routing-helper pool, out of the user-facing slots
(runtime/router/scheduler.py, "Residency classes"). The same helpers run a policy the user tries
out (`/v1/routing/validate`). How the decision is shown on the answer is the API's
(api/openai/routing.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

from lemonade.errors import APIError, bad_request
from lemonade.labels import ROUTER_RECIPE
from lemonade.model_info import ModelInfo
from lemonade.routing.context import conversation_key, route_context
from lemonade.routing.cost import estimated_cost
from lemonade.routing.evaluate import ClassifierServices, Decision, decide
from lemonade.runtime.request_context import ClientGone, routing_dependency
from lemonade.services import Services
from lemonade.serving.classification import classifier, classify_with
from lemonade.serving.models import engine_path, resolve

log = logging.getLogger("lemonade.routing")
ROUTE_HEADER = "x-lemonade-route"
HELPER_MAX_TOKENS = 256    # a helper's reply is one small JSON object
LLM_CLASSIFY_PROMPT = ("Classify the user input. Reply with only a JSON object mapping each label name to a score "
                       "from 0 to 1, and no other text.")


def is_router(model: ModelInfo) -> bool:
    return model.recipe == ROUTER_RECIPE


@contextlib.contextmanager
def _as_dependency() -> Iterator[None]:
    """The enclosed calls load and use their model as a routing helper."""
    token = routing_dependency.set(True)
    try:
        yield
    finally:
        routing_dependency.reset(token)


def _json_object(text: str) -> Any:
    """The JSON object in a model's reply (a ``` fence around it is tolerated)."""
    text = text.strip()
    fenced = re.fullmatch(r"```[a-zA-Z]*\n(.*)\n```", text, re.DOTALL)
    return json.loads(fenced.group(1) if fenced else text)


NO_THINK = "/no_think\n"


class Helpers:
    """The classifier services of one request, bound to this server's engines."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    def _model(self, name: str) -> ModelInfo:
        model = resolve(self.svc, name)
        if model.is_collection:
            raise ValueError(f"{name} is a collection")
        return model

    async def _chat(self, model: ModelInfo, system: str, user: str, schema: Mapping[str, Any] | None = None) -> str:
        """The helper's reply, greedy; under `schema` as a grammar when given (the `llm` contract). The
        same request is decided the same way every time: the helper's short prompt is read whole, without
        the prompt cache (a cached prefix changes llama.cpp's arithmetic, and with it a greedy choice at a
        near tie). Speculation is left as the model runs: llama-server cannot switch it per request, so
        asking for it off would restart a model other requests use."""
        body: dict[str, Any] = {
            "model": model.public, "stream": False, "temperature": 0.0, "max_tokens": HELPER_MAX_TOKENS,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "cache_prompt": False}
        if schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "routing_decision", "schema": dict(schema)}}
        with _as_dependency():
            data = await self.svc.proxy.post_json(model, engine_path(self.svc, model, "chat/completions"), body,
                                                  "chat/completions")
        return str(data["choices"][0]["message"].get("content") or "")

    async def classify(self, name: str, text: str) -> Mapping[str, float]:
        model = self._model(name)
        if model.mode == "chat":  # an LLM as classifier
            scores = _json_object(await self._chat(model, LLM_CLASSIFY_PROMPT, text))
        else:  # an encoder classifier: the service /v1/classify uses
            with _as_dependency():
                scores = (await classify_with(self.svc, classifier(self.svc, model.name), [text]))[0]
        if not isinstance(scores, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in scores.values()):
            raise ValueError(f"{name} did not answer label scores: {str(scores)[:200]}")
        return scores

    async def embed(self, name: str, text: str) -> list[float]:
        model = self._model(name)
        with _as_dependency():
            data = await self.svc.proxy.post_json(model, engine_path(self.svc, model, "embeddings"),
                                                  {"model": model.public, "input": text}, "embeddings")
        return list(data["data"][0]["embedding"])

    async def chat(self, name: str, system: str, user: str, schema: Mapping[str, Any]) -> str:
        # `/no_think` first, as Lemonade's router sends it: a reasoning model (Qwen3 and the like)
        # answers the contract at once instead of spending the reply's token cap thinking.
        return await self._chat(self._model(name), system, NO_THINK + user, schema)

    def cost_of(self, name: str) -> Mapping[str, Any]:
        """A candidate's `estimated_cost`: from its catalog entry (a cloud provider's prices, or the
        fields written on the model's definition); nothing for a name this server does not know."""
        model = self.svc.catalog.find(name)
        return estimated_cost(model.definition) if model is not None else {}

    def services(self) -> ClassifierServices:
        return ClassifierServices(classify=self.classify, embed=self.embed, chat=self.chat, cost_of=self.cost_of,
                                  propagate=(ClientGone,))


async def route(svc: Services, router_model: ModelInfo, payload: dict[str, Any]) -> tuple[ModelInfo, Decision]:
    """Decide where a request for `router_model` goes: (the member that answers it, why). `payload`
    (the body to forward) is re-aimed at the member and loses `route_trace`, which is ours."""
    want_trace = payload.pop("route_trace", False)
    if not isinstance(want_trace, bool):
        raise bad_request("'route_trace' must be true or false")
    policy, embeddings = svc.policies.get(router_model.name, router_model.definition)
    decision = await decide(policy, route_context(payload), want_trace=want_trace,
                            services=Helpers(svc).services(), embeddings=embeddings)
    member = svc.catalog.find(decision.route_to)
    if member is None:
        raise APIError(404, f"Router model {router_model.public} chose '{decision.route_to}' (rule "
                            f"{decision.header}), which is no longer a registered model. Register it again, or "
                            "change the policy.", type="not_found", code="model_not_found",
                       headers={ROUTE_HEADER: decision.header})
    switched = svc.stats.record_route(conversation_key(payload), member.name)
    svc.metrics.record_route(switched)
    log.info("Routed a request for %s to %s (%s)", router_model.public, member.public,
             f"rule {decision.matched_rule}" if decision.matched_rule else "default")
    payload["model"] = member.public
    return member, decision
