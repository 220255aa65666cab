"""Issue 16, scale-out on llama.cpp RPC: Gemma 3 270M served split over two workers on two "hosts".

The hosts are Linux network namespaces on this machine (tests/netns.py), each with a real `lemonade
worker` bound to the namespace's address only; the server runs in the root namespace with
`llamacpp.rpc_workers` naming both, so its `llama-server --rpc` places Gemma's layers on the two
workers. Answers come through the official
`openai` client. Also proved: a bad worker entry is a 400 naming it, a load with a worker nobody
listens on is refused (503) naming that worker, health and system-info report the workers, and a
worker stopped with SIGTERM exits cleanly with its rpc-server and shows as unreachable.

Needs root and `ip netns` (skipped otherwise, saying why). Namespaces, links and processes made here
are removed by name/pid in a finalizer, also when a test fails.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.helpers import GEMMA_NAME
from tests.netns import RPC_PORT, TAG, Host, worker_hosts


@pytest.fixture(scope="module")
def hosts(llama_backend: Path, tmp_path_factory: pytest.TempPathFactory):
    with worker_hosts(2, TAG, llama_backend, tmp_path_factory) as made:
        yield made


@pytest.fixture(scope="module")
def rpc_server(module_servers, gemma_dir: Path, hosts: list[Host]):
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                          config={"llamacpp": {"rpc_workers": [h.endpoint for h in hosts]}})


def test_worker_says_what_it_serves(hosts):
    for host in hosts:
        text = host.output.read_text(errors="replace")
        assert f"serving on {host.endpoint}" in text and "device CPU:" in text, text
        assert f'llamacpp.rpc_workers=["{host.endpoint}"]' in text, text


def test_worker_option_checked_entry_by_entry(rpc_server):
    with rpc_server.client() as c:
        r = c.post("/v1/load", json={"model_name": GEMMA_NAME, "rpc_workers": ["10.77.1.2:50052", "nohostport"]})
        assert r.status_code == 400, r.text
        assert "nohostport" in r.json()["error"]["message"] and "rpc_workers" in r.json()["error"]["message"]
        r = c.post("/v1/load", json={"model_name": GEMMA_NAME, "rpc_workers": ["10.77.1.2:70000"]})
        assert r.status_code == 400 and "70000" in r.json()["error"]["message"], r.text
        r = c.post("/v1/load", json={"model_name": GEMMA_NAME, "rpc_workers": "10.77.1.2:50052"})
        assert r.status_code == 400 and "rpc_workers" in r.json()["error"]["message"], r.text


def test_unreachable_worker_refuses_the_load(rpc_server, hosts):
    """Nothing listens on the second worker's port: the load is refused before llama-server starts,
    naming that worker (and only it) and what to do."""
    dead = f"{hosts[1].address}:{RPC_PORT + 1}"
    with rpc_server.client() as c:
        r = c.post("/v1/load", json={"model_name": GEMMA_NAME, "rpc_workers": [hosts[0].endpoint, dead]})
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert dead in message and hosts[0].endpoint not in message, message
        assert "lemonade worker" in message
        assert r.json()["error"]["code"] == "rpc_worker_unreachable"
        assert rpc_server.engine_pids() == []


def test_gemma_split_over_two_workers(rpc_server, hosts):
    client = openai.OpenAI(base_url=rpc_server.url + "/api/v1", api_key="unused", max_retries=0, timeout=600)
    reply = client.chat.completions.create(model=GEMMA_NAME, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    with rpc_server.client() as c:
        health = c.get("/v1/health").json()
    loaded = health["all_models_loaded"][0]
    command = loaded["launch_command"]
    assert command[command.index("--rpc") + 1] == ",".join(h.endpoint for h in hosts)
    assert command[command.index("-ngl") + 1] == "99"  # layers go to the workers' devices
    workers = {w["address"]: w for w in health["rpc_workers"]}
    assert set(workers) == {h.endpoint for h in hosts}
    for host in hosts:
        assert workers[host.endpoint]["reachable"] and workers[host.endpoint]["latency_ms"] >= 0
        assert workers[host.endpoint]["models"] == [GEMMA_NAME]
    # the weights really went to both workers: each rpc-server now holds a share of Gemma's ~250 MB
    for host in hosts:
        grown = host.rpc_rss() - host.idle_rss
        assert grown > 40 * 2**20, f"{host.ns}'s rpc-server grew by only {grown / 2**20:.1f} MiB"


def test_system_info_lists_workers(rpc_server, hosts):
    with rpc_server.client() as c:
        info = c.get("/v1/system-info").json()
    workers = info["recipes"]["llamacpp"]["rpc_workers"]
    assert [w["address"] for w in workers] == [h.endpoint for h in hosts]
    assert all(w["reachable"] for w in workers)


def test_worker_stops_cleanly_and_health_says_so(rpc_server, hosts):
    host = hosts[1]
    pids = set(host.rpc_pids)
    assert pids, "the worker's rpc-server was not seen"
    assert host.stop_worker() == 0, host.output.read_text()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "Stopping the RPC worker" in host.output.read_text()
    deadline = time.monotonic() + 10
    while True:
        health = httpx.get(rpc_server.url + "/v1/health", timeout=30).json()
        down = [w for w in health.get("rpc_workers", []) if w["address"] == host.endpoint]
        if down and not down[0]["reachable"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert down and down[0]["reachable"] is False and down[0]["error"], health.get("rpc_workers")
    # the model spread over it is gone (llama-server aborts on the lost connection), and the reload
    # its next request asks for is refused, naming the worker
    client = openai.OpenAI(base_url=rpc_server.url + "/api/v1", api_key="unused", max_retries=0, timeout=120)
    for _attempt in range(2):  # if llama-server noticed the loss only with this request, that one fails first
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=GEMMA_NAME, max_tokens=4,
                                           messages=[{"role": "user", "content": "Hi"}])
        if refused.value.status_code == 503:
            break
    assert refused.value.status_code == 503 and host.endpoint in refused.value.message
    assert hosts[0].endpoint not in refused.value.message
    health = httpx.get(rpc_server.url + "/v1/health", timeout=30).json()
    assert [m["model_name"] for m in health["crashed_models"]] == [GEMMA_NAME]


def test_config_worker_list_checked(tmp_path):
    """`llamacpp.rpc_workers` from the environment (comma list) and `config set` (JSON), entry by entry;
    nothing is written when an entry is bad."""
    from lemonade.config import Config, ConfigError

    env = Config(tmp_path, environ={"LEMONADE_LLAMACPP_RPC_WORKERS": "10.0.0.2:50052, 10.0.0.3:50052"})
    assert env.get("llamacpp.rpc_workers") == ["10.0.0.2:50052", "10.0.0.3:50052"]
    with pytest.raises(ConfigError, match="llamacpp.rpc_workers.*'bad'"):
        Config(tmp_path, environ={}).set({"llamacpp": {"rpc_workers": ["10.0.0.2:50052", "bad"]}})
    assert not (tmp_path / "config.json").exists()
    Config(tmp_path, environ={}).set({"llamacpp": {"rpc_workers": ["[fd00::2]:50052"]}})
    assert Config(tmp_path, environ={}).get("llamacpp.rpc_workers") == ["[fd00::2]:50052"]
