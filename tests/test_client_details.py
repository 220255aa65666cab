"""Details Lemonade's app, dashboards and scripts match on, checked on the real server with the real
Gemma 3 270M: Prometheus series names and labels, each backend's `release_url` in system-info, the
context length Ollama's `show` reports, and the wording of a refused model source.
"""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import GEMMA_NAME, Server


@pytest.fixture(scope="module")
def http(gemma_server: Server) -> httpx.Client:
    with gemma_server.client() as client:
        yield client


def samples(http: httpx.Client) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_prometheus_series_lemonade_names(http: httpx.Client) -> None:
    text = http.get("/metrics").text
    for help_line in ("# HELP lemonade_loaded_models ", "# HELP lemonade_max_loaded_models ",
                      "# HELP lemonade_model_cache_tokens ", "# HELP lemonade_model_cache_tokens_total ",
                      "# HELP lemonade_cache_tokens_total ", "# HELP lemonade_routing_decisions_total ",
                      "# HELP lemonade_routing_switches_total "):
        assert help_line in text, help_line
    http.post("/v1/unload", json={})
    before = samples(http)
    assert before["lemonade_loaded_models"][0].value == 0
    assert {s.labels["type"]: s.value for s in before["lemonade_max_loaded_models"]}["llm"] == 1
    prompt = {"model": GEMMA_NAME, "max_tokens": 2, "temperature": 0,
              "messages": [{"role": "user", "content": "Name three colours of the rainbow, please."}]}
    for _ in range(2):  # the same prompt twice: the second is served from the engine's prefix cache
        assert http.post("/v1/chat/completions", json=prompt).status_code == 200
    after = samples(http)
    assert after["lemonade_loaded_models"][0].value == 1
    (info,) = after["lemonade_model_info"]
    assert info.labels["model_name"] == GEMMA_NAME and info.labels["recipe"] == "llamacpp"
    assert info.labels["type"] == "llm" and info.labels["device"] == "cpu" and info.labels["checkpoint"]
    cached = {s.labels["model_name"]: s.value for s in after["lemonade_model_cache_tokens_total"]}
    assert cached[GEMMA_NAME] > 0
    stats = http.get("/v1/stats").json()
    assert after["lemonade_cache_tokens_total"][0].value == stats["cache_tokens_total"]


def test_system_info_links_each_pinned_release(http: httpx.Client) -> None:
    recipes = http.get("/v1/system-info").json()["recipes"]
    for backend in recipes["llamacpp"]["backends"].values():
        assert re.fullmatch(r"https://github\.com/ggml-org/llama\.cpp/releases/tag/b\d+", backend["release_url"])
    assert recipes["whispercpp"]["backends"]["cpu"]["release_url"].startswith(
        "https://github.com/ggml-org/whisper.cpp/releases/tag/v")


def test_ollama_show_reports_the_context_the_model_runs_with(http: httpx.Client) -> None:
    assert http.post("/v1/load", json={"model_name": GEMMA_NAME, "ctx_size": 3072}).status_code == 200
    shown = http.post("/api/show", json={"model": GEMMA_NAME}).json()
    assert shown["model_info"]["llamacpp.context_length"] == 3072
    assert "num_ctx 3072" in shown["parameters"]


def test_an_unknown_model_source_is_named_as_such(http: httpx.Client) -> None:
    resp = http.get("/v1/registry/search", params={"query": "qwen", "source": "nexus"})
    assert resp.status_code == 400 and "Unsupported model source 'nexus'" in resp.json()["error"]["message"]
    resp = http.post("/v1/pull", json={"model_name": "user.Nexus", "recipe": "llamacpp", "source": "nexus",
                                       "checkpoint": "owner/repo:Q4_K_M"})
    assert resp.status_code == 400 and "Unsupported model source 'nexus'" in resp.json()["error"]
