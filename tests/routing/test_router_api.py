"""A router collection on the surfaces Lemonade's clients use beyond chat: `/v1/responses` (plain,
streamed, typed input), the decision in every routed body, `/v1/load` (virtual), re-registration,
and `POST /v1/routing/validate` (a policy and a request in, the decision out, nothing served).

Members are the real Gemma 3 270M GGUF under two names of the extra models dir (`pick-small`,
`pick-big`), so which one answered shows in the answer's `model`. The policy-editor endpoint runs
on made-up member names: it takes names as written, as Lemonade's does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, ServerFactory

SMALL, BIG = "pick-small", "pick-big"
ROUTER = "user.Picker"
CODE = "Please write code for me"


def router_body(name: str = ROUTER) -> dict[str, Any]:
    return {"model_name": name, "recipe": "collection.router", "version": "1", "components": [SMALL, BIG],
            "routing": {"candidates": [SMALL, BIG], "default_model": SMALL,
                        "rules": [{"id": "code-to-big", "match": {"keywords_any": ["code", "def "]},
                                   "route_to": BIG, "outputs": {"verdict": "warn"}}]}}


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, tmp_path_factory: pytest.TempPathFactory, gemma_dir: Path) -> Server:
    root = tmp_path_factory.mktemp("picker-models")
    gemma = next(gemma_dir.glob("*.gguf"))
    for name in (SMALL, BIG):
        (root / f"{name}.gguf").symlink_to(gemma)
    # Two chat slots, set explicitly: both members stay loaded, so routing between them never swaps.
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(root)}, config={"max_loaded_models": 2})


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        resp = client.post("/v1/pull", json=router_body())
        assert resp.status_code == 200 and resp.json()["status"] == "success", resp.text
        yield client


def sse_events(resp: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:") and line[5:].strip()
            not in ("", "[DONE]")]


def test_decision_is_in_every_routed_body_and_its_trace_on_request(http: httpx.Client) -> None:
    plain = http.post("/v1/chat/completions", json={"model": "Picker", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": CODE}]})
    assert plain.status_code == 200 and plain.headers["x-lemonade-route"] == "code-to-big"
    body = plain.json()
    assert body["model"] == BIG and body["choices"][0]["message"]["content"] is not None
    assert body["x_lemonade_route"] == {"version": "1", "route_to": BIG, "matched_rule": "code-to-big",
                                        "default_used": False, "outputs": {"verdict": "warn"}}
    traced = http.post("/v1/chat/completions", json={"model": ROUTER, "max_tokens": 4, "route_trace": True,
                                                      "messages": [{"role": "user", "content": "Hello there"}]})
    route = traced.json()["x_lemonade_route"]
    assert route["route_to"] == SMALL and route["default_used"] is True and route["outputs"] == {}
    assert route["trace"] == [{"condition": "keywords_any", "result": False}]


def test_responses_are_routed_plain_streamed_and_typed(http: httpx.Client) -> None:
    plain = http.post("/v1/responses", json={"model": "Picker", "input": CODE, "max_output_tokens": 16})
    assert plain.status_code == 200, plain.text
    assert plain.headers["x-lemonade-route"] == "code-to-big" and plain.json()["model"] == BIG
    assert plain.json()["x_lemonade_route"]["route_to"] == BIG
    typed = http.post("/v1/responses", json={
        "model": ROUTER, "max_output_tokens": 16,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello, how are you?"}]}]})
    assert typed.status_code == 200, typed.text
    assert typed.headers["x-lemonade-route"] == "default" and typed.json()["model"] == SMALL
    with http.stream("POST", "/v1/responses", json={"model": ROUTER, "input": CODE, "max_output_tokens": 16,
                                                   "stream": True, "route_trace": True}) as resp:
        assert resp.status_code == 200 and resp.headers["x-lemonade-route"] == "code-to-big"
        events = sse_events(resp)
    first = events[0]["x_lemonade_route"]
    assert first["route_to"] == BIG and first["trace"] == [{"condition": "keywords_any", "result": True}]
    assert all("x_lemonade_route" not in e for e in events[1:])
    assert any(e.get("type") == "response.completed" for e in events)


def test_load_is_virtual(http: httpx.Client) -> None:
    assert http.post("/v1/unload", json={}).status_code == 200
    resp = http.post("/v1/load", json={"model_name": "Picker"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "success" and resp.json()["recipe"] == "collection.router"
    assert http.get("/v1/health").json()["all_models_loaded"] == []  # no member was started


def test_registering_again_replaces_the_policy(http: httpx.Client) -> None:
    body = router_body("user.Again")
    assert http.post("/v1/pull", json=body).status_code == 200
    body["routing"]["default_model"] = BIG
    again = http.post("/v1/pull", json=body)
    assert again.status_code == 200 and again.json()["status"] == "success", again.text
    assert http.get("/v1/models/Again").json()["routing"]["default_model"] == BIG


# ----- POST /v1/routing/validate -------------------------------------------------------------------

POLICY = {"version": "1", "recipe": "collection.router", "components": ["Local-8B", "vllm.big-32b"],
          "routing": {"candidates": ["Local-8B", "vllm.big-32b"], "default_model": "Local-8B",
                      "rules": [{"id": "code-to-big", "match": {"any": [{"keywords_any": ["def ", "compile"]},
                                                                        {"regex": "```[a-z]*"}]},
                                 "route_to": "vllm.big-32b"},
                                {"id": "tools-to-big", "match": {"has_tools": True}, "route_to": "vllm.big-32b"},
                                {"id": "images-to-big", "match": {"has_images": True}, "route_to": "vllm.big-32b"},
                                {"id": "acme-to-big", "match": {"metadata": {"key": "tenant", "equals": "acme"}},
                                 "route_to": "vllm.big-32b"}]}}


def validate(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/routing/validate", json={"policy": POLICY, **body})


@pytest.mark.parametrize(("request_fields", "rule"), [
    ({"prompt": "please write a def to reverse a list"}, "code-to-big"),
    ({"prompt": "what is the weather like?"}, ""),
    ({"prompt": "call a tool", "has_tools": True}, "tools-to-big"),
    ({"prompt": "call a tool", "has_tools": False}, ""),
    ({"prompt": "describe this", "has_images": True}, "images-to-big"),
    ({"prompt": "hi", "metadata": {"tenant": "acme"}}, "acme-to-big"),
    ({"prompt": "hi", "metadata": {"tenant": "other"}}, ""),
])
def test_validate_decides_without_serving(http: httpx.Client, request_fields: dict, rule: str) -> None:
    resp = validate(http, **request_fields)
    assert resp.status_code == 200, resp.text
    decision = resp.json()["decision"]
    assert decision["matched_rule"] == rule and decision["default_used"] is (rule == "")
    assert decision["route_to"] == ("vllm.big-32b" if rule else "Local-8B")
    assert isinstance(decision["trace"], list) and decision["trace"]  # always traced
    assert resp.json()["normalized_policy"] == POLICY  # no router to desugar: the policy as sent


def test_validate_an_llm_router_falls_open_and_shows_its_rules(http: httpx.Client) -> None:
    policy = {"version": "1", "recipe": "collection.router", "components": ["A", "B", "no-such-router-model"],
              "routing": {"candidates": ["A", "B"], "default_model": "A",
                          "router": {"type": "llm", "model": "no-such-router-model", "prompt": "Pick one."}}}
    resp = http.post("/v1/routing/validate", json={"policy": policy, "prompt": "hello"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["decision"]["route_to"] == "A" and resp.json()["decision"]["default_used"] is True
    routing = resp.json()["normalized_policy"]["routing"]
    assert "router" not in routing
    assert [(c["id"], c["type"]) for c in routing["classifiers"]] == [("__router", "llm")]
    assert [r["id"] for r in routing["rules"]] == ["__route_0", "__route_1"]


BAD_VALIDATIONS = [
    ({"policy": {"version": "1", "components": ["A"]}, "prompt": "x"}, "routing"),
    ({"policy": {**POLICY, "components": ["Local-8B"]}, "prompt": "x"}, "vllm.big-32b"),
    ({"policy": {**POLICY, "routing": {**POLICY["routing"], "classifiers": [
        {"id": "pii", "type": "classifier", "model": "undeclared-classifier", "labels": ["safe", "unsafe"]}]}},
      "prompt": "x"}, "undeclared-classifier"),
    ({"policy": "not an object"}, "'policy'"),
    ({"policy": POLICY, "prompt": 12345}, "'prompt'"),
    ({"policy": POLICY, "has_images": "yes"}, "'has_images'"),
    ({"policy": POLICY, "has_tools": 1}, "'has_tools'"),
    ({"policy": POLICY, "metadata": "tenant=acme"}, "'metadata'"),
    ({"policy": POLICY, "metadata": {"tenant": 123}}, "'tenant'"),
]


@pytest.mark.parametrize(("body", "named"), BAD_VALIDATIONS)
def test_validate_refuses_bad_input_naming_it(http: httpx.Client, body: dict, named: str) -> None:
    resp = http.post("/v1/routing/validate", json=body)
    assert resp.status_code == 400, resp.text
    assert named in resp.json()["error"], resp.json()
