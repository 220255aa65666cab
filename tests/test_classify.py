"""`POST /v1/classify` on the real onnxruntime engine, and `POST /v1/systemone` on llama.cpp.

The classifiers are all-MiniLM-L6-v2 with heads trained by `tests/classifier_models.py` on small
synthetic data sets and exported to ONNX (meaningful scores): the tests check the labels predicted
for held-out sentences, and the exact scores against the PyTorch model's own. They are served from
the local hub, so `/v1/pull` downloads them with the real huggingface_hub; the engine is ONNX Runtime
in its private venv (installed once into the test cache). One server for the whole module.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from lemonade.api.responses import Classified
from tests.classifier_models import (
    HELD_OUT_CITY,
    HELD_OUT_MULTI,
    HELD_OUT_TOPICS,
    REPOS,
    TOPICS,
    classifier_models,
    publish_classifiers,
)
from tests.helpers import GEMMA_NAME

TOLERANCE = 2e-3  # ONNX Runtime vs. PyTorch, float32


@pytest.fixture(scope="module")
def models() -> Path:
    return classifier_models()


@pytest.fixture(scope="module")
def reference(models) -> dict:
    return json.loads((models / "reference.json").read_text())


@pytest.fixture(scope="module")
def server(module_servers, hub_server, gemma_dir, onnx_backend, models):
    publish_classifiers(hub_server, models)
    return module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                          engines=("llamacpp", "onnxruntime"))


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        for name, repo in REPOS.items():
            resp = c.post("/v1/pull", json={"model_name": f"user.{name}", "checkpoint": repo,
                                            "recipe": "onnxruntime", "labels": ["classification"]})
            assert resp.status_code == 200, resp.text
        yield c


def loaded(http) -> list[str]:
    return [m["model_name"] for m in http.get("/v1/health").json()["all_models_loaded"]]


def classify(http, model: str | None, text, path: str = "/v1/classify", **extra) -> httpx.Response:
    body = {"input": text, **extra}
    if model is not None:
        body["model"] = model
    return http.post(path, json=body)


def near(got: dict[str, float], want: dict[str, float]) -> bool:
    return set(got) == set(want) and all(abs(got[k] - want[k]) < TOLERANCE for k in want)


# --- every bad input is a 400 (404 for an unknown model) before anything loads ------------------------

BAD = [
    ("not JSON", b"{input: 1", 400, "invalid_json", "Invalid JSON body"),
    ("not an object", b'["hello"]', 400, "invalid_json", "JSON object"),
    ("no input", {"model": "user.Topic"}, 400, "missing_argument", "'input' (or its alias 'text')"),
    ("input a number", {"model": "user.Topic", "input": 12345}, 400, "invalid_argument", "'input"),
    ("text a number", {"model": "user.Topic", "text": 1.5}, 400, "invalid_argument", "'text"),
    ("input empty", {"model": "user.Topic", "input": "  "}, 400, "invalid_argument", "'input': the text"),
    ("input empty list", {"model": "user.Topic", "input": []}, 400, "invalid_argument", "list of texts is empty"),
    ("list with a number", {"model": "user.Topic", "input": ["ok", 3]}, 400, "invalid_argument", "'input"),
    ("list with a blank", {"model": "user.Topic", "input": ["ok", ""]}, 400, "invalid_argument", "'input[1]'"),
    ("input and text", {"model": "user.Topic", "input": "a", "text": "b"}, 400, "invalid_argument", "not both"),
    ("top_k zero", {"model": "user.Topic", "input": "a", "top_k": 0}, 400, "invalid_argument", "'top_k'"),
    ("top_k negative", {"model": "user.Topic", "input": "a", "top_k": -2}, 400, "invalid_argument", "'top_k'"),
    ("top_k a string", {"model": "user.Topic", "input": "a", "top_k": "two"}, 400, "invalid_argument", "'top_k'"),
    ("top_k a float", {"model": "user.Topic", "input": "a", "top_k": 1.5}, 400, "invalid_argument", "'top_k'"),
    ("model a number", {"model": 7, "input": "a"}, 400, "invalid_argument", "'model'"),
    ("model empty", {"model": "", "input": "a"}, 400, "invalid_argument", "'model'"),
    ("no model, none loaded", {"input": "a"}, 400, "missing_argument", "exactly one classification model"),
    ("unknown model", {"model": "nonexistent-classifier-xyz", "input": "a"}, 404, "model_not_found", "not been found"),
    ("a chat model", {"model": GEMMA_NAME, "input": "a"}, 400, "model_mode_mismatch", "'chat' model"),
]


@pytest.mark.parametrize(("case", "body", "status", "code", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_requests_are_refused_before_any_load(http, case, body, status, code, message):
    if isinstance(body, bytes):
        resp = http.post("/v1/classify", content=body, headers={"Content-Type": "application/json"})
    else:
        resp = http.post("/v1/classify", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == code and message in err["message"], err
    assert loaded(http) == []


# --- scores that mean something -----------------------------------------------------------------------


def test_topics_of_held_out_sentences(http, reference):
    for text, topic in HELD_OUT_TOPICS.items():
        resp = classify(http, "user.Topic", text)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["object"] == "classification" and body["model"] == "Topic"
        Classified.model_validate(body)  # what /openapi.json documents
        labels = body["labels"]
        assert list(labels) == sorted(labels, key=labels.get, reverse=True), "highest first"
        assert max(labels, key=labels.get) == topic, (text, labels)
        assert abs(sum(labels.values()) - 1) < 1e-4, "single-label softmax"
        assert near(labels, reference["topic"][text]), (labels, reference["topic"][text])
    assert loaded(http) == ["Topic"]


def test_batch_text_alias_prefixes_and_top_k(http, reference):
    texts = list(HELD_OUT_TOPICS)
    resp = http.post("/api/v1/classify", json={"model": "user.Topic", "text": texts})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list" and body["model"] == "Topic"
    Classified.model_validate(body)
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    for item, text in zip(body["data"], texts, strict=True):
        assert item["object"] == "classification"
        assert near(item["labels"], reference["topic"][text]), "batched (padded) = one by one"
        assert max(item["labels"], key=item["labels"].get) == HELD_OUT_TOPICS[text]
    best = classify(http, "user.Topic", texts[0], path="/v0/classify", top_k=1).json()["labels"]
    assert list(best) == [HELD_OUT_TOPICS[texts[0]]]
    assert len(classify(http, "user.Topic", texts[0], top_k=99).json()["labels"]) == len(TOPICS)


def test_model_may_be_omitted_while_one_classifier_is_loaded(http):
    assert loaded(http) == ["Topic"]
    resp = classify(http, None, "Our team won the game in the final minute")
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "Topic" and max(resp.json()["labels"], key=resp.json()["labels"].get) == "sports"


def test_token_classification_finds_unseen_cities(http, reference):
    for text, has_city in HELD_OUT_CITY.items():
        resp = classify(http, "user.City", text)
        assert resp.status_code == 200, resp.text
        labels = resp.json()["labels"]
        assert set(labels) == {"O", "CITY"}
        assert (labels["CITY"] > 0.5) == has_city, (text, labels)
        assert near(labels, reference["city"][text])
    assert loaded(http) == ["City"], "one classification slot: the topic model made room"


def test_multi_label_sigmoid(http, reference):
    for text, present in HELD_OUT_MULTI.items():
        labels = classify(http, "user.Multi", text).json()["labels"]
        assert {k for k, v in labels.items() if v > 0.5} == present, (text, labels)
        assert near(labels, reference["multilabel"][text])
    both = classify(http, "user.Multi", next(iter(HELD_OUT_MULTI))).json()["labels"]
    assert sum(both.values()) > 1.2, "independent sigmoids, not a softmax"


def test_manifest_overrides_the_config(http, reference):
    """Same weights as the multi-label model; its config has no problem_type (softmax would be
    assumed), the manifest says sigmoid and renames the labels."""
    for text in HELD_OUT_MULTI:
        labels = classify(http, "user.Manifest", text).json()["labels"]
        want = {k.upper(): v for k, v in reference["multilabel"][text].items()}
        assert near(labels, want), (labels, want)


@pytest.mark.parametrize(("name", "message"), [
    ("user.XLNet", "Unsupported architecture: config.json 'model_type' is 'xlnet'"),
    ("user.NoConfig", "one folder must hold model.onnx, tokenizer.json and config.json"),
])
def test_unservable_folders_are_refused_at_load(server, http, name, message):
    resp = classify(http, name, "hello there")
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "model_load_refused" and message in err["message"], err
    assert name.removeprefix("user.") not in loaded(http)
    workers = server.engine_pids("classify_worker.py")
    assert len(workers) <= 1, "no worker was started for the refused model"


def test_backend_listed_as_installed(http):
    recipe = http.get("/v1/system-info").json()["recipes"]["onnxruntime"]
    assert recipe["backends"]["cpu"]["state"] == "installed"
    assert "onnxruntime" not in [m["recipe"] for m in http.get("/v1/health").json()["crashed_models"] or []]


def test_registration_rules(http):
    resp = http.post("/v1/pull", json={"model_name": "user.Chatty", "checkpoint": REPOS["Topic"],
                                       "recipe": "onnxruntime", "labels": ["chat"]})
    assert resp.status_code == 400
    assert "recipe 'onnxruntime' cannot serve 'chat'. It serves 'classification'" in resp.json()["error"]


# --- /v1/systemone: checked in full before any load; the pinned llama-server does not answer it ---------

QUESTIONS = {"route": {"type": "choice", "instructions": "Which team should handle this?",
                       "criteria": {"billing": None, "shipping": "parcels", "technical": None}},
             "angry": {"type": "noul", "instructions": "Is the customer angry?"},
             "urgency": {"type": "score", "instructions": "How urgent is this?",
                         "criteria": ["can wait", "this week", "today", "right now"]}}
STATE = "Customer message: I was charged twice for my order last week and nobody has replied."


@pytest.fixture(scope="module")
def decider(http) -> str:
    """A llama.cpp model registered as a decision model (labels classification + systemone)."""
    resp = http.post("/v1/pull", json={"model_name": "user.Decider", "checkpoint": "test-org/tiny-multiquant-GGUF:Q4_0",
                                       "recipe": "llamacpp", "labels": ["classification", "systemone"]})
    assert resp.status_code == 200, resp.text
    return "user.Decider"


def q(**changes) -> dict:
    return {"route": {**QUESTIONS["route"], **changes}}


SYSTEMONE_BAD = [
    ("not JSON", b"{", "invalid_json", "Invalid JSON body"),
    ("not an object", b"[1]", "invalid_json", "JSON object"),
    ("no state", {"questions": QUESTIONS}, "missing_argument", "'state'"),
    ("no questions", {"state": STATE}, "missing_argument", "'questions'"),
    ("questions a list", {"state": STATE, "questions": []}, "invalid_argument", "'questions'"),
    ("questions empty", {"state": STATE, "questions": {}}, "invalid_argument", "empty object"),
    ("question not an object", {"state": STATE, "questions": {"a": "why?"}}, "invalid_argument", "'questions.a'"),
    ("unknown type", {"state": STATE, "questions": q(type="ranking")}, "invalid_argument", "'questions.route.type'"),
    ("no type", {"state": STATE, "questions": {"a": {"instructions": "x"}}}, "missing_argument",
     "'questions.a.type'"),
    ("no instructions", {"state": STATE, "questions": {"a": {"type": "noul"}}}, "missing_argument",
     "'questions.a.instructions'"),
    ("instructions a number", {"state": STATE, "questions": q(instructions=3)}, "invalid_argument",
     "'questions.route.instructions'"),
    ("choice without criteria", {"state": STATE, "questions": {"a": {"type": "choice", "instructions": "x"}}},
     "missing_argument", "'questions.a.criteria'"),
    ("choice criteria a list", {"state": STATE, "questions": q(criteria=["a", "b"])}, "invalid_argument",
     "'questions.route.criteria'"),
    ("choice option described by a number", {"state": STATE, "questions": q(criteria={"a": 1})},
     "invalid_argument", "'questions.route.criteria.a'"),
    ("score with one level", {"state": STATE, "questions": {"u": {**QUESTIONS["urgency"], "criteria": ["now"]}}},
     "invalid_argument", "2 to 10 levels"),
    ("score with eleven levels", {"state": STATE, "questions": {
        "u": {**QUESTIONS["urgency"], "criteria": [str(i) for i in range(11)]}}}, "invalid_argument", "got 11 levels"),
    ("score level a number", {"state": STATE, "questions": {"u": {**QUESTIONS["urgency"], "criteria": ["a", 2]}}},
     "invalid_argument", "'questions.u.criteria[1]'"),
    ("noul criteria with another key", {"state": STATE, "questions": {
        "n": {**QUESTIONS["angry"], "criteria": {"maybe": "?"}}}}, "invalid_argument", "unknown key 'maybe'"),
    ("unknown question field", {"state": STATE, "questions": q(weight=2)}, "invalid_argument", "unknown field(s)"),
    ("images not a list", {"state": STATE, "questions": QUESTIONS, "images": "data:image/png;base64,AA"},
     "invalid_argument", "'images'"),
    ("image not a data URL", {"state": STATE, "questions": QUESTIONS, "images": ["http://x/y.png"]},
     "invalid_argument", "'images[0]'"),
    ("null state without images", {"state": None, "questions": QUESTIONS}, "invalid_argument", "'state'"),
    ("ctx_size a string", {"state": STATE, "questions": QUESTIONS, "ctx_size": "big"}, "invalid_argument",
     "'ctx_size'"),
    ("model a number", {"model": 5, "state": STATE, "questions": QUESTIONS}, "invalid_argument", "'model'"),
    ("unknown field", {"state": STATE, "questions": QUESTIONS, "temperature": 0}, "invalid_argument",
     "Unknown field(s) temperature"),
]


@pytest.mark.parametrize(("case", "body", "code", "message"), SYSTEMONE_BAD, ids=[b[0] for b in SYSTEMONE_BAD])
def test_systemone_bad_requests(http, decider, case, body, code, message):
    if isinstance(body, bytes):
        resp = http.post("/v1/systemone", content=body, headers={"Content-Type": "application/json"})
    else:
        resp = http.post("/v1/systemone", json={"model": decider, **body})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == code and message in err["message"], err


def test_systemone_models(http, decider):
    http.post("/v1/unload", json={})
    body = {"state": STATE, "questions": QUESTIONS}
    resp = http.post("/v1/systemone", json={"model": "no-such-decider", **body})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    for name in (GEMMA_NAME, "user.Topic"):  # a chat model; a classifier without the systemone label
        resp = http.post("/v1/systemone", json={"model": name, **body})
        assert resp.status_code == 400, resp.text
        assert "lacks the" in resp.json()["error"]["message"] and "'systemone'" in resp.json()["error"]["message"]
    resp = http.post("/api/v1/systemone", json=body)
    assert resp.status_code == 400 and "exactly one classification model" in resp.json()["error"]["message"]
    # A valid request for a decision model: the pinned llama-server has no /v1/systemone, said before loading.
    resp = http.post("/v1/systemone", json={"model": decider, **body, "images": ["data:image/png;base64,iVBORw0K"]})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "model_load_refused"
    assert "does not answer them" in resp.json()["error"]["message"]
    assert loaded(http) == []


def test_decision_model_label_rules(http):
    resp = http.post("/v1/pull", json={"model_name": "user.Clf", "recipe": "llamacpp", "labels": ["classification"],
                                       "checkpoint": "test-org/tiny-multiquant-GGUF:Q4_0"})
    assert resp.status_code == 400 and "recipe 'llamacpp' cannot serve 'classification'" in resp.json()["error"]
    assert set(http.get("/v1/models/user.Decider").json()["labels"]) >= {"classification", "systemone"}


def test_no_process_left_behind(server, http):
    http.post("/v1/unload", json={})
    assert server.engine_pids("classify_worker.py") == []
