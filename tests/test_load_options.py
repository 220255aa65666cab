"""Option layering on loads, as Lemonade's clients rely on it (api-lemonade.md, `/v1/load` and
`/v1/models/{id}/options`), on the real Gemma 3 270M and llama-server.

- A load's `llamacpp_args` replaces the model's saved args for that load, while the server-wide
  args still merge under it (`merge_args`); the saved entry is left as it was.
- Saving options merges; an empty `llamacpp_args` or a null drops that key; whole seconds only for
  the idle timeouts.
- An inference request that loads its model forwards only `ctx_size` to that load; nothing else in
  it (sampling, residency, engine flags) reaches the loaded model's options.
- `/v1/health` lists a loaded model's engine options: the router's residency options are not among them.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.helpers import GEMMA_ID, GEMMA_NAME, Server, ServerFactory

URL = f"/v1/models/{GEMMA_NAME}/options"
RESIDENCY = ("auto_evict", "evict_idle_timeout", "downsize_idle_timeout", "evict_weight_factor")


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, gemma_dir: Path) -> Server:
    # Server-wide llama.cpp flags, set explicitly: the merge of global and per-load args is under test.
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                          config={"llamacpp": {"args": "--no-warmup --threads 1"}})


@pytest.fixture
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        client.delete(URL)
        client.post("/v1/unload", json={})
        yield client


def loaded_options(http: httpx.Client) -> dict:
    (model,) = [m for m in http.get("/v1/health").json()["all_models_loaded"] if m["model_name"] == GEMMA_NAME]
    return model["recipe_options"]


def test_load_args_replace_the_saved_args_and_keep_the_global_ones(http: httpx.Client, server: Server) -> None:
    assert http.post(URL, json={"llamacpp_args": "--threads-batch 1"}).status_code == 200
    resp = http.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": "--threads 2"})
    assert resp.status_code == 200, resp.text
    args = loaded_options(http)["llamacpp_args"].split()
    assert "--no-warmup" in args and "--threads-batch" not in args  # global kept, saved replaced
    assert args[args.index("--threads") + 1] == "2" and args.count("--threads") == 1  # the load's value wins
    stored = json.loads((server.config_dir / "recipe_options.json").read_text())[GEMMA_ID]
    assert stored == {"llamacpp_args": "--threads-batch 1"}  # the load did not rewrite the saved layer


def test_saving_merges_and_empty_or_null_drops_a_key(http: httpx.Client) -> None:
    defaults = http.get(URL).json()["defaults"]
    http.post(URL, json={"ctx_size": 4096})
    merged = http.post(URL, json={"llamacpp_args": "--threads 2"}).json()
    assert merged["saved"] == {"ctx_size": 4096, "llamacpp_args": "--threads 2"}
    assert http.post(URL, json={"llamacpp_args": ""}).json()["saved"] == {"ctx_size": 4096}
    cleared = http.post(URL, json={"ctx_size": None}).json()
    assert cleared["saved"] == {} and cleared["effective"]["ctx_size"] == defaults["ctx_size"]


@pytest.mark.parametrize("body", [{"evict_idle_timeout": 600.5}, {"downsize_idle_timeout": 0.25},
                                  {"evict_idle_timeout": -1}])
def test_idle_timeouts_are_whole_seconds(http: httpx.Client, server: Server, body: dict) -> None:
    resp = http.post(URL, json=body)
    assert resp.status_code == 400 and next(iter(body)) in resp.json()["error"]["message"]
    assert http.get(URL).json()["saved"] == {}
    assert http.post("/v1/load", json={"model_name": GEMMA_NAME, **body}).status_code == 400


def test_auto_load_takes_only_ctx_size_from_the_request(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json={
        "model": GEMMA_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2,
        "temperature": 0.9, "top_p": 0.8, "seed": 4, "ctx_size": 3072, "llamacpp_args": "--threads-batch 1",
        "pinned": True, "auto_evict": True, "evict_idle_timeout": 1})
    assert resp.status_code == 200, resp.text
    options = loaded_options(http)
    assert options["ctx_size"] == 3072
    assert "--threads-batch" not in options["llamacpp_args"]
    for key in ("temperature", "top_p", "seed", "max_tokens", "pinned", *RESIDENCY):
        assert key not in options, key
    health = http.get("/v1/health").json()["all_models_loaded"][0]
    assert health["pinned"] is False
    # Already loaded: a later request's ctx_size does not reload it.
    again = http.post("/v1/completions", json={"model": GEMMA_NAME, "prompt": "Hi", "max_tokens": 1,
                                                "ctx_size": 2048})
    assert again.status_code == 200 and loaded_options(http)["ctx_size"] == 3072
    assert http.get(URL).json()["saved"] == {}  # nothing was saved


def test_bad_ctx_size_on_an_inference_request_is_a_400(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json={"model": GEMMA_NAME, "ctx_size": "big",
                                                    "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code == 400 and "ctx_size" in resp.json()["error"]["message"]


def test_loading_again_with_the_same_options_keeps_the_engine(http: httpx.Client) -> None:
    pids = []
    for _ in range(2):
        assert http.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
        (model,) = http.get("/v1/health").json()["all_models_loaded"]
        pids.append(model["pid"])
    assert pids[0] == pids[1]
    # Different options do reload it.
    assert http.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 2048}).status_code == 200
    assert http.get("/v1/health").json()["all_models_loaded"][0]["pid"] != pids[0]
