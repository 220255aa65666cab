"""Issue 42, part 3: llama.cpp RPC workers found, not typed.

Three worker hosts are network namespaces (tests/netns.py); the workers of the first two run with
`--broadcast` and announce themselves with discovery beacons (real UDP datagrams to their link's
broadcast address, on a beacon port of the test's own), the third does not (announcing is opt-in).
A server with `llamacpp.rpc_workers: "auto"` spreads Gemma over the two it heard and no other;
`lemonade scan` lists the server and those two workers, with their devices and free memory; a server
that hears no worker refuses an "auto" load saying what to do.

Needs root and `ip netns` (skipped otherwise, saying why).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import openai
import pytest

from tests.helpers import GEMMA_NAME, cli_env, lemonade, ok
from tests.netns import Host, worker_hosts

SCAN_SECONDS = 6  # worker and server beacons leave every 2 s


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def beacon_port() -> str:
    """A UDP port of the test's own, so no other server or worker on this machine is heard."""
    return str(free_udp_port())


@pytest.fixture(scope="module")
def hosts(llama_backend: Path, tmp_path_factory: pytest.TempPathFactory, beacon_port: str):
    with worker_hosts(3, f"ld{os.getpid() % 100000}", llama_backend, tmp_path_factory,
                      options=lambda i: ["--broadcast"] if i < 2 else [],
                      env={"LEMONADE_BEACON_PORT": beacon_port}) as made:
        yield made


@pytest.fixture(scope="module")
def auto_server(module_servers, gemma_dir: Path, hosts: list[Host], beacon_port: str):
    # LEMONADE_BROADCAST unset: this server sends beacons too (test servers do not by default), for scan
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "LEMONADE_BEACON_PORT": beacon_port,
                               "LEMONADE_BROADCAST": ""},
                          config={"llamacpp": {"rpc_workers": "auto"}})


def test_workers_say_they_announce_themselves_only_when_asked(hosts, beacon_port):
    for host in hosts[:2]:
        assert f"Announcing it on UDP port {beacon_port}" in host.run_output()
    assert "Announcing" not in hosts[2].run_output()


def test_scan_lists_the_server_and_the_announcing_workers(auto_server, hosts, beacon_port, tmp_path):
    env = cli_env(tmp_path / "cache", LEMONADE_BEACON_PORT=beacon_port)
    text = ok(lemonade("scan", "--duration", str(SCAN_SECONDS), env=env, timeout=SCAN_SECONDS + 60)).stdout
    assert "Discovered: " in text and auto_server.url.split("//")[1] in text, text
    for host in hosts[:2]:
        line = re.search(rf"- \S+ at {re.escape(host.endpoint)}: llamacpp:cpu, CPU ([\d.]+) (MiB|GiB) free of "
                         rf"([\d.]+) (MiB|GiB), idle", text)
        assert line, text
    assert hosts[2].endpoint not in text
    assert "Found 2 llama.cpp RPC worker(s)" in text


def test_auto_spreads_the_model_over_the_workers_heard(auto_server, hosts):
    client = openai.OpenAI(base_url=auto_server.url + "/api/v1", api_key="unused", max_retries=0, timeout=600)
    reply = client.chat.completions.create(model=GEMMA_NAME, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hello."}])
    assert reply.choices[0].message.content
    with auto_server.client() as c:
        health = c.get("/v1/health").json()
    command = health["all_models_loaded"][0]["launch_command"]
    assert command[command.index("--rpc") + 1] == ",".join(h.endpoint for h in hosts[:2])
    listed = {w["address"]: w for w in health["rpc_workers"]}
    assert set(listed) == {h.endpoint for h in hosts[:2]}
    assert all(listed[h.endpoint]["models"] == [GEMMA_NAME] for h in hosts[:2])
    assert all(sum(listed[h.endpoint]["layers"].values()) > 0 for h in hosts[:2])


def test_auto_with_no_worker_heard_refuses_the_load_saying_what_to_do(module_servers, gemma_dir: Path):
    lonely = module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir),
                                 "LEMONADE_BEACON_PORT": str(free_udp_port())})
    with lonely.client(timeout=120) as c:
        r = c.post("/v1/load", json={"model_name": GEMMA_NAME, "rpc_workers": "auto"})  # per model
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "no llama.cpp RPC worker announced itself" in message and "--broadcast" in message
    assert r.json()["error"]["code"] == "rpc_worker_unreachable"
    assert lonely.engine_pids() == []
