"""A `collection.router` model end to end: registered with `/v1/pull`, called with the official
`openai` client (streamed and not), answered by real members, exported and imported with the CLI.

The members are the real Gemma 3 270M GGUF under two names (`route-small`, `route-big`: one file,
two models, both kept loaded), so which one answered is visible in `/v1/health` and in the
answer's `model`. The `semantic_similarity` condition runs on a real embedding model
(all-MiniLM-L6-v2 converted to GGUF, tests/models.py): its scores carry meaning, so the test
checks that a coding question is routed to the big member and small talk is not. The `classifier`
condition runs on a real encoder: MiniLM with a topic head trained by tests/classifier_models.py,
served by the onnxruntime engine (`/v1/classify`'s service), so a cooking sentence it has not seen
is routed by its label. The `llm` condition and the LLM router are decided by Gemma itself (below).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.classifier_models import HELD_OUT_TOPICS, REPOS, TOPICS, classifier_models, publish_classifiers
from tests.helpers import Server, ServerFactory, run_cli
from tests.models import minilm_gguf

SMALL, BIG, EMBED = "route-small", "route-big", "all-MiniLM-L6-v2"
ROUTER = "user.Router"
CODE_QUESTION = "Can you write a Python function that sorts a list of numbers?"
SMALL_TALK = "What a lovely sunny day it is today."


def policy(name: str = ROUTER) -> dict[str, Any]:
    return {
        "model_name": name, "recipe": "collection.router", "version": "1", "components": [SMALL, BIG, EMBED],
        "routing": {
            "candidates": [SMALL, BIG], "default_model": SMALL,
            "classifiers": [{"id": "topic", "type": "semantic_similarity", "model": EMBED,
                             "reference_phrases": {"code": ["write a python function", "fix the bug in this code"],
                                                   "chat": ["how are you today", "nice weather"]}}],
            "rules": [
                {"id": "no-consent-stays-small", "match": {"metadata": {"key": "consent", "equals": "denied"}},
                 "route_to": SMALL, "outputs": {"reason": "privacy"}},
                {"id": "code-to-big", "match": {"any": [{"keywords_any": ["stack trace"]},
                                                        {"classifier": "topic", "label": "code", "min_score": 0.5}]},
                 "route_to": BIG},
            ]}}


@pytest.fixture(scope="module")
def extra_dir(tmp_path_factory: pytest.TempPathFactory, gemma_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("router-models")
    gemma = next(gemma_dir.glob("*.gguf"))
    for name in (SMALL, BIG):
        (root / f"{name}.gguf").symlink_to(gemma)
    (root / EMBED).mkdir()
    (root / EMBED / minilm_gguf().name).symlink_to(minilm_gguf())
    return root


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, extra_dir: Path, hub_server: Any, request: pytest.FixtureRequest) -> Server:
    request.getfixturevalue("onnx_backend")  # the onnxruntime engine, installed once into the test cache
    # Two chat slots: both members stay loaded, so routing back and forth never swaps models.
    publish_classifiers(hub_server, classifier_models())  # the topic classifier (classifier_models.py), pulled below
    return module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(extra_dir)},
                          config={"max_loaded_models": 2}, engines=("llamacpp", "onnxruntime"))


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def router(http: httpx.Client) -> str:
    resp = http.post("/v1/pull", json=policy())
    assert resp.status_code == 200, resp.text
    return ROUTER


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def loaded(http: httpx.Client) -> set[str]:
    return {m["model_name"] for m in http.get("/v1/health").json()["all_models_loaded"]}


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_registered_router_is_listed_with_its_policy(http: httpx.Client, router: str) -> None:
    obj = http.get(f"/v1/models/{router}").json()
    assert obj["recipe"] == "collection.router" and obj["components"] == [SMALL, BIG, EMBED]
    assert obj["routing"] == policy()["routing"] and obj["version"] == "1"
    assert obj["downloaded"] is True  # every member is a file of the extra models dir


def test_chat_routed_by_meaning_with_trace(oai: openai.OpenAI, http: httpx.Client, router: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(model=router, messages=ask(CODE_QUESTION), max_tokens=4,
                                                        temperature=0, extra_body={"route_trace": True})
    assert raw.headers["x-lemonade-route"] == "code-to-big"
    answer = raw.parse()
    assert answer.choices[0].message.content and answer.model == BIG  # the member answered, under its name
    route = answer.model_extra["x_lemonade_route"]
    assert route["route_to"] == BIG and route["matched_rule"] == "code-to-big" and route["default_used"] is False
    metadata, keywords, topic = route["trace"]
    assert metadata == {"condition": "metadata", "result": False}
    assert keywords == {"condition": "keywords_any", "result": False}
    assert topic["condition"] == "classifier:topic" and topic["label"] == "code" and topic["result"] is True
    assert topic["score"] > 0.5
    assert BIG in {n.removeprefix("extra.") for n in loaded(http)}

    small_talk = oai.chat.completions.with_raw_response.create(
        model=router, messages=ask(SMALL_TALK), max_tokens=4, temperature=0, extra_body={"route_trace": True})
    assert small_talk.headers["x-lemonade-route"] == "default"
    route = small_talk.parse().model_extra["x_lemonade_route"]
    assert route["route_to"] == SMALL and route["default_used"] is True and route["matched_rule"] == ""
    assert route["trace"][-1]["score"] < 0.3  # small talk is far from the coding phrases
    assert {SMALL, BIG} <= {n.removeprefix("extra.") for n in loaded(http)}


def test_streamed_route_in_first_event_only(oai: openai.OpenAI, router: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=router, messages=ask("Here is my stack trace, what went wrong?"), max_tokens=8, temperature=0,
        stream=True, extra_body={"route_trace": True})
    assert raw.headers["x-lemonade-route"] == "code-to-big"
    chunks = list(raw.parse())
    assert len(chunks) > 2
    first = chunks[0].model_extra["x_lemonade_route"]
    assert first["route_to"] == BIG and first["trace"][-1] == {"condition": "keywords_any", "result": True}
    assert all("x_lemonade_route" not in (c.model_extra or {}) for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # Without route_trace the first event still carries the decision (as Lemonade's server sends it), minus the trace.
    plain = oai.chat.completions.with_raw_response.create(
        model=router, messages=ask(SMALL_TALK), max_tokens=4, temperature=0, stream=True)
    assert plain.headers["x-lemonade-route"] == "default"
    chunks = list(plain.parse())
    assert chunks[0].model_extra["x_lemonade_route"] == {"version": "1", "route_to": SMALL, "matched_rule": "",
                                                         "default_used": True, "outputs": {}}
    assert all("x_lemonade_route" not in (c.model_extra or {}) for c in chunks[1:])


def test_metadata_and_completions(oai: openai.OpenAI, router: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=router, messages=ask(CODE_QUESTION), max_tokens=4, metadata={"consent": "denied"},
        extra_body={"route_trace": True})
    assert raw.headers["x-lemonade-route"] == "no-consent-stays-small"
    route = raw.parse().model_extra["x_lemonade_route"]
    assert route["route_to"] == SMALL and route["outputs"] == {"reason": "privacy"}
    assert route["trace"] == [{"condition": "metadata", "result": True}]  # the embedder was not asked

    text = oai.completions.with_raw_response.create(model=router, prompt="def main():  # stack trace", max_tokens=4,
                                                    extra_body={"route_trace": True})
    assert text.headers["x-lemonade-route"] == "code-to-big"
    done = text.parse()
    assert done.choices[0].text and done.model_extra["x_lemonade_route"]["route_to"] == BIG
    streamed = oai.completions.with_raw_response.create(model=router, prompt=SMALL_TALK, max_tokens=4, stream=True)
    assert streamed.headers["x-lemonade-route"] == "default"
    assert "".join(c.choices[0].text for c in streamed.parse() if c.choices)


def test_counters_in_stats_and_metrics(oai: openai.OpenAI, http: httpx.Client, router: str) -> None:
    before = http.get("/v1/stats").json()
    first = ask("hello there")
    oai.chat.completions.create(model=router, messages=first, max_tokens=2)
    # The same conversation, next turn: now about code, so it moves to the other member (one switch).
    oai.chat.completions.create(model=router, max_tokens=2, messages=[
        *first, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "there is a stack trace"}])
    after = http.get("/v1/stats").json()
    assert after["routing_decisions_total"] == before["routing_decisions_total"] + 2
    assert after["routing_switches_total"] == before["routing_switches_total"] + 1
    metrics = http.get("/metrics").text
    assert f"lemonade_routing_decisions_total {float(after['routing_decisions_total'])}" in metrics
    assert f"lemonade_routing_switches_total {float(after['routing_switches_total'])}" in metrics


BAD = [
    ({"routing": {**policy()["routing"], "default_model": EMBED}}, "routing.default_model 'all-MiniLM-L6-v2' must be"),
    ({"routing": {**policy()["routing"], "rules": [{"id": "r", "match": {"regex": "(x"}, "route_to": BIG}]}},
     "routing.rules[0].match.regex is not a valid regular expression"),
    ({"routing": {**policy()["routing"], "candidates": [SMALL, BIG, EMBED]}},
     "routing.candidates[2] 'all-MiniLM-L6-v2' is a model of mode 'embeddings'; it must be a model of mode 'chat'"),
    ({"components": [SMALL, BIG, EMBED, "nowhere"]}, "component 'nowhere' is not registered"),
    ({"version": "2"}, 'version must be "1"'),
    ({"recipe": "collection.omni"}, "only 'collection.router' models take 'routing'"),
    ({"routing": {**policy()["routing"], "classifiers": [{"id": "topic", "type": "semantic_similarity",
                                                           "model": SMALL, "reference_phrases": {"code": ["y"]}}]}},
     "routing.classifiers[0].model 'route-small' is a model of mode 'chat'; it must be a model of mode 'embeddings'"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_invalid_policy_refused_with_400(http: httpx.Client, server: Server, change: dict[str, Any],
                                         message: str) -> None:
    resp = http.post("/v1/pull", json={**policy("user.Broken"), **change})
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"], resp.json()
    assert http.get("/v1/models/user.Broken").status_code == 404
    stored = server.config_dir / "user_models.json"
    assert not stored.exists() or "Broken" not in json.loads(stored.read_text())


def test_router_refused_where_it_cannot_route(oai: openai.OpenAI, router: str) -> None:
    with pytest.raises(openai.BadRequestError, match="routes /chat/completions, /completions and /responses"):
        oai.embeddings.create(model=router, input="x")
    with pytest.raises(openai.BadRequestError, match="'route_trace' must be true or false"):
        oai.chat.completions.create(model=router, messages=ask("x"), extra_body={"route_trace": "yes"})


def test_export_import_round_trip(server: Server, http: httpx.Client, router: str, tmp_path: Path) -> None:
    out = run_cli(server, "export", router, "-o", str(tmp_path / "router.json"))
    assert out.returncode == 0, out.stderr
    exported = json.loads((tmp_path / "router.json").read_text())
    assert exported["recipe"] == "collection.router" and exported["routing"] == policy()["routing"]
    assert exported["version"] == "1" and exported["components"] == [SMALL, BIG, EMBED]
    exported["model_name"] = "user.Router-Copy"
    (tmp_path / "copy.json").write_text(json.dumps(exported))
    out = run_cli(server, "import", str(tmp_path / "copy.json"))
    assert out.returncode == 0, out.stderr + out.stdout
    copy = http.get("/v1/models/user.Router-Copy").json()
    assert copy["routing"] == policy()["routing"]
    resp = http.post("/v1/chat/completions", json={"model": "user.Router-Copy", "messages": ask("a stack trace"),
                                                    "max_tokens": 2})
    assert resp.status_code == 200 and resp.headers["x-lemonade-route"] == "code-to-big"


def test_classifier_condition_on_a_real_encoder(oai: openai.OpenAI, http: httpx.Client) -> None:
    resp = http.post("/v1/pull", json={"model_name": "user.Topic", "checkpoint": REPOS["Topic"],
                                       "recipe": "onnxruntime", "labels": ["classification"]})
    assert resp.status_code == 200, resp.text
    body = {"model_name": "user.Topic-Router", "recipe": "collection.router", "version": "1",
            "components": [SMALL, BIG, "user.Topic"],
            "routing": {"candidates": [SMALL, BIG], "default_model": SMALL,
                        "classifiers": [{"id": "topic", "type": "classifier", "model": "user.Topic",
                                         "labels": list(TOPICS)}],
                        "rules": [{"id": "cooking-to-big", "route_to": BIG,
                                   "match": {"classifier": "topic", "label": "cooking", "min_score": 0.5}}]}}
    resp = http.post("/v1/pull", json=body)
    assert resp.status_code == 200, resp.text
    cooking = next(t for t, topic in HELD_OUT_TOPICS.items() if topic == "cooking")
    weather = next(t for t, topic in HELD_OUT_TOPICS.items() if topic == "weather")
    for text, rule, member in ((cooking, "cooking-to-big", BIG), (weather, "default", SMALL)):
        raw = oai.chat.completions.with_raw_response.create(model="user.Topic-Router", messages=ask(text),
                                                            max_tokens=2, extra_body={"route_trace": True})
        assert raw.headers["x-lemonade-route"] == rule, text
        route = raw.parse().model_extra["x_lemonade_route"]
        (band,) = route["trace"]
        assert route["route_to"] == member and band["condition"] == "classifier:topic" and band["label"] == "cooking"
        assert (band["score"] > 0.5) == (member == BIG), band
    # The policy's helper model is checked at registration: a chat model cannot be a `semantic_similarity` one,
    # and a classifier must be a classification (or chat) model.
    body["routing"]["classifiers"][0]["model"] = EMBED
    body["components"] = [SMALL, BIG, EMBED]
    resp = http.post("/v1/pull", json={**body, "model_name": "user.Bad-Topic-Router"})
    assert resp.status_code == 400
    assert "routing.classifiers[0].model 'all-MiniLM-L6-v2' is a model of mode 'embeddings'" in resp.json()["error"]


# ----- conditions decided by a real LLM -----------------------------------------------------------
# The `llm` condition and `routing.router` ask Gemma 3 270M (the small member doubles as the judge, so
# nothing more is loaded), greedy and under the reply contract's JSON-schema grammar (rationale, then
# label), which leaves it only the words of its reason and the label to choose. The questions are ones
# this 270M base model answers right: whether the user agrees, and which member a request names. Each
# was asked 5 times through this server in both label orders (2026-12-03), right every time; here each
# is asked twice, so an answer that drifts between asks of the same request would show.
REPEATS = 2
AGREES, REFUSES = ["Yes, please go ahead.", "Sure, do it."], ["No, do not do that.", "No thanks."]
CONSENT_ROUTER, LLM_ROUTER = "user.Consent-Router", "user.Llm-Router"


def consent_policy(labels: list[str]) -> dict[str, Any]:
    return {"model_name": CONSENT_ROUTER, "recipe": "collection.router", "version": "1", "components": [SMALL, BIG],
            "routing": {"candidates": [SMALL, BIG], "default_model": SMALL,
                        "classifiers": [{"id": "consent", "type": "llm", "model": SMALL,
                                         "prompt": "Does the user agree?", "labels": labels}],
                        # an answer out of contract would match neither rule and go to the default
                        "rules": [{"id": "agreed-to-big", "route_to": BIG,
                                   "match": {"classifier": "consent", "label": "yes"}},
                                  {"id": "refused-stays-small", "route_to": SMALL,
                                   "match": {"classifier": "consent", "label": "no"}}]}}


@pytest.mark.parametrize("labels", [["yes", "no"], ["no", "yes"]])
def test_llm_condition_decided_by_the_real_model(oai: openai.OpenAI, http: httpx.Client, labels: list[str]) -> None:
    resp = http.post("/v1/pull", json=consent_policy(labels))
    assert resp.status_code == 200, resp.text
    asks = [(text, "agreed-to-big", BIG) for text in AGREES]
    asks += [(text, "refused-stays-small", SMALL) for text in REFUSES]
    for text, rule, member in asks:
        for _ in range(REPEATS):
            raw = oai.chat.completions.with_raw_response.create(model=CONSENT_ROUTER, messages=ask(text), max_tokens=2,
                                                                extra_body={"route_trace": True})
            route = raw.parse().model_extra["x_lemonade_route"]
            assert raw.headers["x-lemonade-route"] == rule, (text, route)
            assert route["route_to"] == member and raw.parse().model == member
            band = route["trace"][-1]  # the band that matched: the label the model chose, with its reason
            assert band["condition"] == "classifier:consent" and band["result"] is True and band["score"] == 1.0
            assert band["rationale"] and len(band["rationale"]) <= 160  # the model's words, to the grammar's bound


def test_llm_router_picks_the_member_the_request_names(oai: openai.OpenAI, http: httpx.Client) -> None:
    body = {"model_name": LLM_ROUTER, "recipe": "collection.router", "version": "1", "components": [SMALL, BIG],
            "routing": {"candidates": [SMALL, BIG], "default_model": SMALL,
                        "router": {"type": "llm", "model": SMALL,
                                   "prompt": f"Pick the model the request asks for: {BIG} or {SMALL}."}}}
    resp = http.post("/v1/pull", json=body)
    assert resp.status_code == 200, resp.text
    for text, member in ((f"A question for {BIG}: why is the sky blue?", BIG),
                         (f"A question for {SMALL}: why is the sky blue?", SMALL)):
        for _ in range(REPEATS):
            raw = oai.chat.completions.with_raw_response.create(model=LLM_ROUTER, messages=ask(text), max_tokens=2,
                                                                extra_body={"route_trace": True})
            route = raw.parse().model_extra["x_lemonade_route"]
            assert route["route_to"] == member and route["default_used"] is False, (text, route)
            assert raw.parse().model == member
