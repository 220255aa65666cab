"""Issue 16, cloud offload: an OpenAI-compatible provider registered by name, its models listed as
`provider.model` and served through our router and proxy.

The "cloud" is real: a second `llama-server` (the cached llama.cpp build) serving Gemma 3 270M on
loopback with `--api-key`, so it refuses requests without the key. Our server (with the same Gemma
as a local model) is driven with the official openai and anthropic clients; the key must reach the
provider and never appear in an answer, a listing or the server's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from lemonade.backends.llamacpp.engine import fallback_template
from tests.helpers import GEMMA_NAME, free_port

KEY = "sk-loopback-7c1e0d9a"
ENV_KEY = "sk-envkey-52b8f1"  # the same provider again, keyed from the server's environment
CLOUD_MODEL = "vendor/gemma-cloud"  # providers' ids often hold a "/": listed as loopback.vendor/gemma-cloud
CHAT = [{"role": "user", "content": "Name three colors."}]


def test_discovery_names_and_kinds():
    """How a provider's `GET /models` items become catalog entries (pure; no server)."""
    from lemonade.backends.cloud.providers import model_from_listing, public_id

    assert public_id("fireworks", "accounts/fireworks/models/kimi-k2p5") == "fireworks.kimi-k2p5"
    assert public_id("together", "together/llama-3") == "together.llama-3"
    assert public_id("openai", "gpt-4o") == "openai.gpt-4o"
    chat = model_from_listing("or", {"id": "a/b", "context_length": 8192, "capabilities": ["tools"],
                                     "architecture": {"modality": "text+image->text"}})
    assert chat.name == "or.a/b" and chat.mode == "chat" and chat.recipe == "cloud"
    assert chat.labels == ["vision", "tool-calling"] and chat.definition["context_length"] == 8192
    embed = model_from_listing("openai", {"id": "text-embedding-3-small"})
    assert embed.mode == "embeddings" and embed.labels == ["embeddings"]
    for other in ("whisper-1", "tts-1", "dall-e-3", "omni-moderation-latest"):
        assert model_from_listing("openai", {"id": other}) is None
    assert model_from_listing("x", {"object": "model"}) is None


def test_listed_prices_per_million_tokens():
    """Providers' `pricing` as USD per 1M tokens; 0, missing or unreadable prices are not shown (pure)."""
    from lemonade.backends.cloud.providers import listed_prices

    assert listed_prices({"pricing": {"prompt": "0.000003", "completion": "0.000015"}}) == {
        "cost_input_per_million": pytest.approx(3.0), "cost_output_per_million": pytest.approx(15.0)}
    assert listed_prices({"pricing": {"input": 0.88, "output": "1.2"}}) == {
        "cost_input_per_million": 0.88, "cost_output_per_million": 1.2}
    assert listed_prices({"pricing": {"prompt": "0", "completion": "-1"}}) == {}
    assert listed_prices({"pricing": {"input": "n/a", "output": True}}) == {}
    assert listed_prices({"pricing": {"input": "inf"}}) == {} and listed_prices({"id": "x"}) == {}


def test_provider_usage_counts_its_cached_prompt_tokens():
    """A provider's OpenAI `usage` (no llama.cpp timings) counts in /v1/stats with its cached prompt
    tokens; its `prompt_tokens` already includes them, so the prompt is not counted twice (pure)."""
    from lemonade.runtime.stats import Stats

    stats = Stats()
    usage = {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52,
             "prompt_tokens_details": {"cached_tokens": 37}}
    assert stats.record_llamacpp({"usage": usage}) == (50, 2)
    last = stats.snapshot()
    assert (last["input_tokens"], last["cache_tokens"], last["prompt_tokens"]) == (50, 37, 50)
    assert last["cache_tokens_total"] == 37
    stats.record_llamacpp({"usage": {"prompt_tokens": 9, "completion_tokens": 1}})  # a provider that does not say
    assert stats.snapshot()["cache_tokens"] is None and stats.snapshot()["cache_tokens_total"] == 37


@pytest.fixture(scope="module")
def cloud(llama_backend, gemma_dir):
    """llama-server with an API key: the provider. Stopped by pid at the end."""
    port = free_port()
    proc = subprocess.Popen(
        [str(llama_backend / "llama-server"), "-m", str(next(gemma_dir.glob("*.gguf"))), "--host", "127.0.0.1",
         "--port", str(port), "--ctx-size", "2048", "--alias", CLOUD_MODEL, "--api-key", KEY, "--jinja",
         "--chat-template-file", str(fallback_template("gemma3")), "--no-webui", "--threads", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the cloud llama-server exited"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    yield {"url": url + "/v1", "proc": proc}
    proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def server(module_servers, gemma_dir, cloud):
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "LEMONADE_ENVCLOUD_API_KEY": ENV_KEY})


@pytest.fixture(scope="module")
def http(server):
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def installed(http, cloud):
    resp = http.post("/v1/install", json={"backend": "cloud", "provider": "loopback", "base_url": cloud["url"],
                                          "api_key": KEY, "allow_insecure_http": True})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def oai(server, installed):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def assert_no_key(*texts: str) -> None:
    for text in texts:
        assert KEY not in text and ENV_KEY not in text


HTTP_WARNINGS = ["Base URL uses http://; traffic to this provider is not encrypted.",
                 "An API key is configured for this http:// provider; Lemonade will send it as a Bearer token over "
                 "plaintext HTTP."]


def test_install_discovers_and_lists(http, installed, cloud, server):
    assert installed == {"status": "success", "backend": "cloud", "provider": "loopback", "base_url": cloud["url"],
                         "allow_insecure_http": True, "auth_header_name": "Authorization",
                         "auth_header_prefix": "Bearer ", "models_discovered": 1,
                         "auth_state": {"env_var_set": False, "runtime_key_set": True},
                         "warnings": HTTP_WARNINGS, "warning": " ".join(HTTP_WARNINGS)}
    models = http.get("/v1/models").json()["data"]
    entry = next(m for m in models if m["id"] == f"loopback.{CLOUD_MODEL}")
    assert entry["recipe"] == "cloud" and entry["cloud_provider"] == "loopback" and entry["downloaded"] is True
    assert entry["owned_by"] == "lemonade"  # api-openai.md: always; the provider is in cloud_provider
    assert any(m["id"] == GEMMA_NAME for m in models)  # the local model is listed beside it
    info = http.get("/v1/system-info").json()["cloud"]["providers"]
    assert info == [{"name": "loopback", "base_url": cloud["url"], "allow_insecure_http": True,
                     "auth_header_name": "Authorization", "auth_header_prefix": "Bearer ",
                     "env_var": "LEMONADE_LOOPBACK_API_KEY", "env_var_set": False, "runtime_key_set": True,
                     "models_discovered": 1, "warnings": HTTP_WARNINGS}]
    cli = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "cloud", "list", "--json"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "LEMONADE_BASE_URL": server.url})
    assert cli.returncode == 0 and json.loads(cli.stdout) == info  # `lemonade cloud list --json`
    saved = json.loads((server.config_dir / "config.json").read_text())
    assert saved["cloud_providers"] == [{"name": "loopback", "base_url": cloud["url"], "allow_insecure_http": True}]
    assert_no_key(json.dumps(models), json.dumps(info), (server.config_dir / "config.json").read_text())


def test_chat_through_the_provider(oai, http):
    resp = oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4)
    assert resp.object == "chat.completion" and resp.choices[0].message.role == "assistant"
    assert 0 < resp.usage.completion_tokens <= 4
    # Streamed: relayed chunk by chunk, ending like any OpenAI stream.
    chunks = list(oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4,
                                              temperature=0, stream=True))  # greedy: never 4 blanks
    assert len(chunks) >= 3 and chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    health = http.get("/v1/health").json()
    cloud = next(m for m in health["all_models_loaded"] if m["model_name"] == f"loopback.{CLOUD_MODEL}")
    assert cloud["recipe"] == "cloud" and cloud["pid"] is None and cloud["launch_command"] == []
    assert_no_key(json.dumps(health))


def test_completions_responses_anthropic_and_ollama(oai, server):
    done = oai.completions.create(model=f"loopback.{CLOUD_MODEL}", prompt="Once upon a time", max_tokens=4)
    assert done.choices[0].text and done.usage.completion_tokens <= 4
    resp = oai.responses.create(model=f"loopback.{CLOUD_MODEL}", input="Say hello.", max_output_tokens=4)
    assert resp.output and resp.output[0].type == "message"
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    msg = claude.messages.create(model=f"loopback.{CLOUD_MODEL}", max_tokens=4, messages=CHAT)
    assert msg.role == "assistant" and msg.content[0].type == "text"
    olla = ollama.Client(host=server.url, timeout=120)
    assert f"loopback.{CLOUD_MODEL}:latest" in [m.model for m in olla.list().models]
    reply = olla.chat(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, options={"num_predict": 4})
    assert reply.message.role == "assistant" and reply.done


def test_cloud_takes_no_local_slot(oai, http):
    """max_loaded_models is 1: the local Gemma and the cloud model are both resident and both answer."""
    local = oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=4)
    remote = oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4)
    assert local.choices and remote.choices
    loaded = {m["model_name"] for m in http.get("/v1/health").json()["all_models_loaded"]}
    assert {GEMMA_NAME, f"loopback.{CLOUD_MODEL}"} <= loaded


def test_streams_count_in_stats_whether_the_client_asked_for_usage_or_not(http, server):
    """The provider is asked for a stream's usage; a client that did not ask gets its stream as it
    would have (no usage event), one that asked gets the provider's; both count in /v1/stats."""
    body = {"model": f"loopback.{CLOUD_MODEL}", "messages": CHAT, "max_tokens": 4, "stream": True}

    def events(extra: dict) -> list[dict]:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, **extra}, timeout=120) as resp:
            assert resp.status_code == 200
            return [json.loads(line[5:]) for line in resp.iter_lines()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]"]

    before = http.get("/v1/stats").json()
    plain = events({})
    assert plain and not [e for e in plain if e.get("usage")]
    after = http.get("/v1/stats").json()
    assert after["request_count_total"] == before["request_count_total"] + 1
    assert 0 < after["output_tokens"] <= 4 and after["output_tokens_total"] == before["output_tokens_total"] + \
        after["output_tokens"]
    asked = events({"stream_options": {"include_usage": True}})
    usage = [e["usage"] for e in asked if e.get("usage")]
    assert len(usage) == 1 and http.get("/v1/stats").json()["output_tokens"] == usage[0]["completion_tokens"]


def test_env_key_wins(http, cloud):
    """LEMONADE_ENVCLOUD_API_KEY is set in the server's environment: discovery uses it, and a runtime
    key is refused with 409 (the install's key is not stored, with a warning)."""
    resp = http.post("/v1/install", json={"backend": "cloud", "provider": "envcloud", "base_url": cloud["url"],
                                          "api_key": "other", "allow_insecure_http": True})
    assert resp.status_code == 200 and "LEMONADE_ENVCLOUD_API_KEY" in resp.json()["warning"]
    assert resp.json()["auth_state"] == {"env_var_set": True, "runtime_key_set": False}
    # That key is not the provider's: it refuses the discovery (401), so no model of it is listed.
    assert resp.json()["models_discovered"] == 0
    conflict = http.post("/v1/cloud/auth", json={"provider": "envcloud", "api_key": KEY})
    assert conflict.status_code == 409
    assert conflict.json()["error"]["type"] == "auth_conflict"
    assert conflict.json()["error"]["env_var"] == "LEMONADE_ENVCLOUD_API_KEY"
    gone = http.post("/v1/uninstall", json={"backend": "cloud", "provider": "envcloud"})
    assert gone.json()["models_evicted"] == 0


def test_wrong_key_is_a_502_naming_the_provider(http, oai):
    assert http.post("/v1/cloud/auth", json={"provider": "loopback", "api_key": "wrong"}).status_code == 200
    with pytest.raises(openai.APIStatusError) as err:
        oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4)
    assert err.value.status_code == 502 and "loopback" in err.value.message
    assert err.value.body["code"] == "cloud_auth_failed"
    ok = http.post("/v1/cloud/auth", json={"provider": "loopback", "api_key": KEY})
    assert ok.json() == {"provider": "loopback", "allow_insecure_http": True,  # kept from the install
                         "auth_state": {"env_var_set": False, "runtime_key_set": True}, "models_discovered": 1,
                         "warnings": HTTP_WARNINGS, "warning": " ".join(HTTP_WARNINGS)}
    assert oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4).choices


def test_bad_input(http):
    refused = http.post("/v1/delete", json={"model_name": f"loopback.{CLOUD_MODEL}"})
    assert refused.status_code == 400 and "lemonade cloud uninstall loopback" in refused.json()["error"]["message"]
    cases = [({"backend": "cloud", "provider": "x"}, 400, "base_url"),
             ({"backend": "cloud", "base_url": "http://h/v1"}, 400, "provider"),
             ({"backend": "cloud", "provider": "Bad Name", "base_url": "http://h/v1"}, 400, "provider"),
             ({"backend": "cloud", "provider": "user", "base_url": "http://h/v1"}, 400, "provider"),
             ({"backend": "cloud", "provider": "x", "base_url": "ftp://h"}, 400, "base_url"),
             ({"backend": "cloud", "provider": "x", "base_url": "http://"}, 400, "host"),
             ({"backend": "cloud", "provider": "x", "base_url": "http://h/v1", "auth_header_name": "a b"}, 400,
              "auth_header_name")]
    for body, status, field in cases:
        resp = http.post("/v1/install", json=body)
        assert resp.status_code == status and field in resp.json()["error"]["message"], (body, resp.text)
    unknown = http.post("/v1/cloud/auth", json={"provider": "nope", "api_key": "k"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/cloud/auth", json={"provider": "loopback", "api_key": ""}).status_code == 400
    assert http.post("/v1/uninstall", json={"backend": "cloud", "provider": "nope"}).status_code == 404
    assert http.delete("/v1/cloud/auth/nope").status_code == 404


# OpenRouter lists USD per token as strings, Together USD per million as numbers (the cloud guide).
OPENROUTER_PRICING = {"prompt": "0.0000005", "completion": "0.0000015"}   # $0.50 / $1.50 per 1M tokens
TOGETHER_ENTRY = {"id": "together-style", "pricing": {"input": 0.2, "output": 0.6}}


@pytest.fixture(scope="module")
def priced(cloud):
    """The provider's `GET /models` as a pricing provider lists it: the real llama-server's listing,
    with OpenRouter's `pricing` on its model and one more entry priced as Together prices (llama-server
    lists no prices). Every other request is relayed to the real llama-server unchanged."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Relay(BaseHTTPRequestHandler):
        def _relay(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            upstream = httpx.request(method, cloud["url"].removesuffix("/v1") + self.path, content=body,
                                     headers=headers, timeout=120)
            payload = upstream.content
            if method == "GET" and self.path == "/v1/models" and upstream.status_code == 200:
                listing = upstream.json()
                for entry in listing["data"]:
                    entry["pricing"] = OPENROUTER_PRICING
                listing["data"].append(TOGETHER_ENTRY)
                payload = json.dumps(listing).encode()
            self.send_response(upstream.status_code)
            self.send_header("Content-Type", upstream.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._relay("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._relay("POST")

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
    Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_prices_are_listed_and_reported_on_router_decisions(http, priced):
    """A provider's prices are on its models in /v1/models (USD per 1M tokens, OpenRouter's per-token
    figures times 1e6, Together's as listed), and a router collection's decision for one of them carries
    them as `outputs.estimated_cost`; a registered model's hand-written cost fields are reported too, and
    a rule's own `estimated_cost` is kept."""
    resp = http.post("/v1/install", json={"backend": "cloud", "provider": "priced", "base_url": priced, "api_key": KEY,
                                          "allow_insecure_http": True})
    assert resp.status_code == 200 and resp.json()["models_discovered"] == 2, resp.text
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    remote = f"priced.{CLOUD_MODEL}"
    assert listed[remote]["cost_input_per_million"] == pytest.approx(0.5)
    assert listed[remote]["cost_output_per_million"] == pytest.approx(1.5)
    assert (listed["priced.together-style"]["cost_input_per_million"],
            listed["priced.together-style"]["cost_output_per_million"]) == (0.2, 0.6)
    assert "cost_input_per_million" not in listed[GEMMA_NAME]  # nothing known: nothing shown
    cheap = http.post("/v1/models/register", json={"model_name": "user.Cheap", "recipe": "llamacpp",
                                                   "checkpoint": "example/cheap-GGUF:Q4_K_M", "cost_tier": "free",
                                                   "latency_ms_hint": 40})
    assert cheap.status_code == 200, cheap.text
    bad = http.post("/v1/models/register", json={"model_name": "user.Odd", "recipe": "llamacpp",
                                                 "checkpoint": "example/odd-GGUF:Q4_K_M", "cost_tier": "cheap"})
    assert bad.status_code == 400 and "'cost_tier' must be one of free, low, medium, high" in bad.text
    policy = {"candidates": [remote, GEMMA_NAME], "default_model": GEMMA_NAME,
              "rules": [{"id": "hard", "match": {"keywords_any": ["prove"]}, "route_to": remote}]}
    resp = http.post("/v1/pull", json={"model_name": "user.CostRouter", "recipe": "collection.router", "version": "1",
                                       "components": [remote, GEMMA_NAME], "routing": policy})
    assert resp.status_code == 200, resp.text
    routed = http.post("/v1/chat/completions", json={"model": "user.CostRouter", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "Please prove it."}]})
    assert routed.status_code == 200, routed.text
    decision = routed.json()["x_lemonade_route"]
    assert decision["route_to"] == remote and routed.json()["choices"][0]["message"]["role"] == "assistant"
    assert decision["outputs"] == {"estimated_cost": {"cost_input_per_million": pytest.approx(0.5),
                                                      "cost_output_per_million": pytest.approx(1.5)}}
    local = http.post("/v1/chat/completions", json={"model": "user.CostRouter", "max_tokens": 4, "messages": CHAT})
    assert local.json()["x_lemonade_route"]["outputs"] == {}  # the local Gemma: no cost known
    validate = {"prompt": "hello", "policy": {"version": "1", "recipe": "collection.router",
                                              "components": ["user.Cheap", remote], "routing": {
        "candidates": ["user.Cheap", remote], "default_model": "user.Cheap",
        "rules": [{"id": "own", "match": {"keywords_any": ["hello"]}, "route_to": remote,
                   "outputs": {"estimated_cost": {"cost_tier": "high"}}}]}}}
    own = http.post("/v1/routing/validate", json=validate).json()["decision"]
    assert own["outputs"] == {"estimated_cost": {"cost_tier": "high"}}  # the rule's author wins
    validate["prompt"] = "something else"
    fell = http.post("/v1/routing/validate", json=validate).json()["decision"]
    assert fell["route_to"] == "user.Cheap" and fell["outputs"] == {
        "estimated_cost": {"cost_tier": "free", "latency_ms_hint": 40.0}}
    assert http.post("/v1/uninstall", json={"backend": "cloud", "provider": "priced"}).status_code == 200


def test_http_provider_keys_need_an_explicit_opt_in(http, cloud, server):
    """A key for an http:// provider is refused until install or auth opts in; the opt-in is kept."""
    base = {"backend": "cloud", "provider": "plain", "base_url": cloud["url"]}
    refused = http.post("/v1/install", json={**base, "api_key": KEY})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "insecure_http_requires_opt_in"
    keyless = http.post("/v1/install", json=base)
    assert keyless.status_code == 200 and keyless.json()["allow_insecure_http"] is False
    assert keyless.json()["warnings"] == HTTP_WARNINGS[:1] and keyless.json()["models_discovered"] == 0
    again = http.post("/v1/cloud/auth", json={"provider": "plain", "api_key": KEY})
    assert again.status_code == 400 and again.json()["error"]["code"] == "insecure_http_requires_opt_in"
    cli = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "cloud", "auth", "plain", "--api-key", KEY,
                          "--allow-insecure-http"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LEMONADE_BASE_URL": server.url})
    said = " ".join(cli.stdout.split())  # (rich wraps long lines)
    assert cli.returncode == 0 and "1 model(s) discovered" in said and "plaintext HTTP" in said
    assert_no_key(cli.stdout, cli.stderr)
    entry = next(p for p in http.get("/v1/system-info").json()["cloud"]["providers"] if p["name"] == "plain")
    assert entry["allow_insecure_http"] is True and entry["warnings"] == HTTP_WARNINGS
    ok = http.post("/v1/cloud/auth", json={"provider": "plain", "api_key": KEY})  # the opt-in was kept
    assert ok.status_code == 200 and ok.json()["allow_insecure_http"] is True and ok.json()["models_discovered"] == 1
    assert ok.json()["warnings"] == HTTP_WARNINGS
    assert http.post("/v1/uninstall", json={"backend": "cloud", "provider": "plain"}).status_code == 200


def test_provider_down_is_a_502_and_local_models_still_answer(http, oai, cloud, server):
    cloud["proc"].kill()
    cloud["proc"].wait(10)
    with pytest.raises(openai.APIStatusError) as err:
        oai.chat.completions.create(model=f"loopback.{CLOUD_MODEL}", messages=CHAT, max_tokens=4)
    assert err.value.status_code == 502 and "'loopback'" in err.value.message
    stream = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": f"loopback.{CLOUD_MODEL}", "messages": CHAT, "max_tokens": 4, "stream": True})
    assert stream.status_code == 200 and "cloud_provider_unreachable" in stream.text  # the SSE error event
    assert oai.chat.completions.create(model=GEMMA_NAME, messages=CHAT, max_tokens=4).choices


def test_clear_key_and_uninstall(http, server):
    loaded = {m["model_name"] for m in http.get("/v1/health").json()["all_models_loaded"]}
    assert f"loopback.{CLOUD_MODEL}" in loaded
    cleared = http.delete("/v1/cloud/auth/loopback").json()
    assert cleared == {"provider": "loopback", "cleared_runtime_key": True,
                       "auth_state": {"env_var_set": False, "runtime_key_set": False}}
    ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
    assert f"loopback.{CLOUD_MODEL}" not in ids  # no key left: its models are withdrawn
    # The loaded one still answers, to say what is missing (and for which provider), until it is unloaded.
    keyless = http.post("/v1/chat/completions", json={"model": f"loopback.{CLOUD_MODEL}", "messages": CHAT})
    assert keyless.status_code == 502 and keyless.json()["error"]["code"] == "cloud_auth_missing"
    assert "No API key for cloud provider 'loopback'" in keyless.json()["error"]["message"]
    assert http.post("/v1/unload", json={"model_name": f"loopback.{CLOUD_MODEL}"}).status_code == 200
    gone = http.post("/v1/uninstall", json={"backend": "cloud", "provider": "loopback"})
    assert gone.json() == {"status": "success", "backend": "cloud", "provider": "loopback", "models_evicted": 0}
    assert json.loads((server.config_dir / "config.json").read_text())["cloud_providers"] == []
    assert "cloud" not in http.get("/v1/system-info").json()
    missing = http.post("/v1/chat/completions", json={"model": f"loopback.{CLOUD_MODEL}", "messages": CHAT})
    assert missing.status_code == 404
    assert_no_key(server.log_path.read_text(errors="replace"))

