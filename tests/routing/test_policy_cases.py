"""The routing engine as a table: policy + request -> decision (and trace), one file of cases per
condition kind, plus a table of invalid policies -> the error that names the field.

Layout (Lemonade's conformance corpus uses the same one, so its `routing/<major>/<group>/`
directories can be dropped under `cases/` and run unchanged): `cases/<kind>/policy.json` and
`cases/<kind>/cases.jsonl`, one case a line: `name`, `request` (a chat, completion or Responses
body), the exact `decision`, and for model-backed kinds the models' answers: `stubs.classify`
(model -> label scores), `stubs.embed` (text -> vector), `stubs.chat` (model -> reply text),
`errors` (models that fail) and optionally `calls` (model -> how often it may be asked). These
answers stand in for the models on purpose: the engine's job is what it does with scores, and the
server's wiring to real models is tested end to end in test_routing_server.py.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from lemonade.routing.context import route_context
from lemonade.routing.evaluate import ClassifierServices, decide
from lemonade.routing.policy import PolicyError, parse_policy

HERE = Path(__file__).parent
CASES = HERE / "cases"


def _load_cases() -> list[Any]:
    params = []
    for cases_file in sorted(CASES.rglob("cases.jsonl")):
        group = cases_file.parent.relative_to(CASES).as_posix()
        policy = json.loads((cases_file.parent / "policy.json").read_text())
        for line in cases_file.read_text().splitlines():
            if line.strip():
                case = json.loads(line)
                params.append(pytest.param(policy, case, id=f"{group}/{case['name']}"))
    return params


def _services(case: dict[str, Any], calls: Counter[str]) -> ClassifierServices:
    stubs, errors = case.get("stubs", {}), set(case.get("errors", []))

    def answer(kind: str, model: str, key: str) -> Any:
        calls[model] += 1
        if model in errors:
            raise RuntimeError(f"{model} is down")
        return stubs[kind][key]

    async def embed(model: str, text: str) -> list[float]:  # awaitable answers work as well as plain ones
        return answer("embed", model, text)

    def chat(model: str, system: str, user: str, schema: Mapping[str, Any]) -> str:
        request = json.loads(user)
        assert set(request) == {"text", "has_tools", "has_images", "chars", "metadata"}
        assert "Choose exactly one of these labels" in system
        labels = schema["properties"]["model"]["enum"]  # the grammar offers the labels the prompt lists
        assert labels and f"these labels: {', '.join(labels)}." in system
        assert schema["required"] == ["rationale", "model"]
        return answer("chat", model, model)

    return ClassifierServices(classify=lambda model, text: answer("classify", model, model), embed=embed, chat=chat)


def test_every_condition_kind_has_cases() -> None:
    kinds = {p.parent.name for p in CASES.rglob("cases.jsonl")}
    assert {"char_bounds", "features", "features_negated", "metadata", "vocabulary", "input_forms", "outputs",
            "resolution", "trace", "classifier", "semantic_similarity", "llm", "llm_router"} <= kinds


@pytest.mark.parametrize(("policy_doc", "case"), _load_cases())
def test_case(policy_doc: dict[str, Any], case: dict[str, Any]) -> None:
    policy = parse_policy(policy_doc)
    request = case["request"]
    calls: Counter[str] = Counter()
    decision = asyncio.run(decide(policy, route_context(request), want_trace=request.get("route_trace") is True,
                                  services=_services(case, calls)))
    assert decision.to_json() == case["decision"]
    for model, count in case.get("calls", {}).items():
        assert calls[model] == count, (model, dict(calls))


def _invalid() -> list[Any]:
    lines = (HERE / "invalid_policies.jsonl").read_text().splitlines()
    return [pytest.param(c["policy"], c["error"], id=c["name"]) for c in map(json.loads, lines) if c]


@pytest.mark.parametrize(("doc", "error"), _invalid())
def test_invalid_policy_names_the_field(doc: dict[str, Any], error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(doc)
    assert error in str(exc.value)


def test_reference_embeddings_are_kept_between_requests() -> None:
    """A semantic_similarity classifier embeds its fixed phrases once, not on every request."""
    from lemonade.routing.evaluate import PolicyEmbeddings

    doc = json.loads((CASES / "semantic_similarity" / "policy.json").read_text())
    policy, cache, calls = parse_policy(doc), PolicyEmbeddings(), Counter[str]()
    vectors = {"fix this bug": [1, 0, 0], "write a function": [0, 1, 0], "how are you": [0, 0, 1], "q": [1, 0, 0]}

    def embed(model: str, text: str) -> list[float]:
        calls[text] += 1
        return vectors[text]

    for _ in range(3):
        d = asyncio.run(decide(policy, route_context({"prompt": "q"}), services=ClassifierServices(embed=embed),
                               embeddings=cache))
        assert d.matched_rule == "coding"
    assert calls["q"] == 3 and calls["fix this bug"] == 1 and calls["how are you"] == 1


def test_failures_the_caller_lists_end_the_request() -> None:
    """A client that left is not a classifier failure: `propagate` lets it through, where any other
    failure of a model applies on_error."""

    class Gone(Exception):
        pass

    def classify(model: str, text: str) -> dict[str, float]:
        raise Gone

    doc = json.loads((CASES / "classifier" / "policy.json").read_text())
    policy, ctx = parse_policy(doc), route_context({"prompt": "x"})
    with pytest.raises(Gone):
        asyncio.run(decide(policy, ctx, services=ClassifierServices(classify=classify, propagate=(Gone,))))
    assert asyncio.run(decide(policy, ctx, services=ClassifierServices(classify=classify))).route_to == "big"


def test_the_chosen_candidates_cost_is_reported_not_decided_on() -> None:
    """`cost_of` adds the chosen candidate's cost as `outputs.estimated_cost` (upstream 10600f092):
    never over a rule's own `estimated_cost`, nothing when none is known, and a lookup that fails
    only loses the figure. Invalid hand-written fields are left out (routing/cost.py)."""
    from lemonade.routing.cost import estimated_cost

    policy = parse_policy({"version": "1", "recipe": "collection.router", "components": ["a", "b", "c"],
                           "routing": {"candidates": ["a", "b", "c"], "default_model": "a", "rules": [
                               {"id": "to-b", "match": {"keywords_any": ["bee"]}, "route_to": "b",
                                "outputs": {"verdict": "ok"}},
                               {"id": "to-c", "match": {"keywords_any": ["sea"]}, "route_to": "c",
                                "outputs": {"estimated_cost": {"cost_tier": "high"}}}]}})
    definitions = {"a": {"cost_tier": "free", "latency_ms_hint": 12, "cost_input_per_million": -1},
                   "b": {"cost_input_per_million": 3, "cost_output_per_million": 15.0, "cost_tier": "pricey"},
                   "c": {"cost_tier": "low"}}

    def run(prompt: str, cost_of: Any) -> dict[str, Any]:
        ctx = route_context({"prompt": prompt})
        return dict(asyncio.run(decide(policy, ctx, services=ClassifierServices(cost_of=cost_of))).outputs)

    def lookup(name: str) -> Mapping[str, Any]:
        return estimated_cost(definitions[name])

    assert run("hello", lookup) == {"estimated_cost": {"cost_tier": "free", "latency_ms_hint": 12.0}}
    assert run("a bee", lookup) == {"verdict": "ok", "estimated_cost": {"cost_input_per_million": 3.0,
                                                                        "cost_output_per_million": 15.0}}
    assert run("the sea", lookup) == {"estimated_cost": {"cost_tier": "high"}}
    assert run("a bee", lambda name: {}) == {"verdict": "ok"}
    assert run("a bee", None) == {"verdict": "ok"}

    def broken(name: str) -> Mapping[str, Any]:
        raise KeyError(name)

    assert run("a bee", broken) == {"verdict": "ok"}
