"""`POST /v1/routing/validate`: a router policy and a request in, the decision out, nothing served.

What a policy editor (Lemonade's Router Builder, its "Test prompt" tab) calls while a policy is
being written: the policy need not be registered, and its member names are taken as written (they
need not be models of this server), but it must be whole, every model it names declared in its
`components`, exactly as registration would require. Model-backed conditions do run, on this
server's models, through the same helpers as a routed request; a helper that cannot run fails as
its `on_error` says, so an `llm` router whose model is missing falls open to `default_model`.
The answer is `{decision, normalized_policy}`: the decision always has its trace, and the policy is
echoed with `routing` as evaluated (`routing.router` desugared into `__router` and `__route_<i>`),
so `decision.matched_rule` names a rule the caller can find. A refusal is a 400 whose `error` is the
message itself (`{"error": "..."}`), the shape Lemonade's editor reads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request

from lemonade.api.errors import APIError
from lemonade.routing.context import RouteContext
from lemonade.routing.evaluate import PolicyEmbeddings, decide
from lemonade.routing.policy import PolicyError, parse_policy
from lemonade.services import Services
from lemonade.serving.routing import Helpers

router = APIRouter(tags=["routing"])


def refused(message: str) -> APIError:
    return APIError(400, message, code="invalid_argument", plain=True)


def _request_context(body: dict[str, Any]) -> RouteContext:
    """The request the policy is tried on; each field of the wrong type is a 400 naming it."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise refused("'prompt' must be a string")
    flags = {}
    for key in ("has_images", "has_tools"):
        value = body.get(key, False)
        if not isinstance(value, bool):
            raise refused(f"'{key}' must be a boolean")
        flags[key] = value
    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        raise refused("'metadata' must be a JSON object of string values")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise refused(f"'metadata' value for key '{key}' must be a string")
    return RouteContext(text=prompt, metadata=metadata, **flags)


@router.post("/routing/validate")
async def validate(request: Request, body: dict[str, Any] = Body(..., examples=[{
        "policy": {"version": "1", "recipe": "collection.router", "components": ["Small", "Big"],
                   "routing": {"candidates": ["Small", "Big"], "default_model": "Small",
                               "rules": [{"id": "code", "match": {"keywords_any": ["def "]}, "route_to": "Big"}]}},
        "prompt": "please write a def to reverse a list", "has_tools": False, "metadata": {"tenant": "acme"}}])
        ) -> dict[str, Any]:
    """Evaluate `policy` on one request (`prompt`, `has_images`, `has_tools`, `metadata`)."""
    svc: Services = request.app.state.services
    policy_doc = body.get("policy")
    if not isinstance(policy_doc, dict):
        raise refused("'policy' must be a JSON object")
    ctx = _request_context(body)
    try:
        policy = parse_policy(policy_doc)
    except PolicyError as exc:
        raise refused(f"Invalid routing policy: {exc}") from None
    decision = await decide(policy, ctx, want_trace=True, services=Helpers(svc).services(),
                            embeddings=PolicyEmbeddings())
    return {"decision": decision.to_json(), "normalized_policy": {**policy_doc, "routing": dict(policy.routing)}}
