"""Issue 42 part 4: the servers of a LAN as one endpoint, proven on a LAN of network namespaces.

Five hosts on one bridge (tests/lan.py), each a network namespace with its own address:

- A: a real server whose only model is all-MiniLM (embeddings), not loaded; `peers` names B, C and
  the forger F; every request of these tests is sent to A;
- B: a real server with Gemma 3 270M and all-MiniLM, both loaded at the start;
- C: a real server with Gemma (not loaded) and a tiny reranker (random weights: only the path counts);
- D: a real server holding another key, whose `peers` names A and B;
- F: a forger (tests/peer_forger.py) that announces itself with forged beacons and relays the
  challenges it gets to B, recording everything sent to it.

A, B, C share LEMONADE_PEER_KEY. Proven through the official clients (openai, ollama, anthropic,
mcp): the peer that has a model (loaded) answers, on every API family, streaming included, while A
starts no engine at all; a killed peer costs at most one failed attempt (the request goes to the next peer,
or is served by A itself); neither D nor F gets anything, and the key never reaches them; with
`peers: "auto"`, A finds the live servers by their beacons and refuses the forged one.

Needs root, iproute2 and bridges (skipped otherwise, saying why). Namespaces, links and processes made
here are removed by name and pid in finalizers, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import psutil
import pytest

from tests.helpers import GEMMA_NAME, Server, ServerFactory, call, texts, wait_for
from tests.lan import Lan, lan_unusable
from tests.models import minilm_gguf, tiny_reranker_gguf

TAG = f"pe{os.getpid() % 100000}"  # names of our namespaces and links
SUBNET = 10 + os.getpid() % 200  # 10.78.<SUBNET>.0/24
BEACON_PORT = 24000 + os.getpid() % 1000  # the LAN's discovery beacons, away from any real server's 13305
PORT = 13305  # every host's server on the default port, as on a real LAN
KEY = "lan-" + secrets.token_urlsafe(24)
OTHER_KEY = "not-the-lan-" + secrets.token_urlsafe(24)
EMBED, RERANK = "all-MiniLM-L6-v2", "tiny-random-reranker"
HELLO = [{"role": "user", "content": "Say hello."}]


def models_dir(root: Path, gemma_dir: Path, *names: str) -> Path:
    """An extra models dir holding the named test models (Gemma at its root, the others in folders
    named for them, as tests/test_embeddings_rerank.py lays them out)."""
    root.mkdir(parents=True, exist_ok=True)
    sources = {EMBED: minilm_gguf, RERANK: tiny_reranker_gguf}
    for name in names:
        if name == GEMMA_NAME:
            gemma = next(gemma_dir.glob("*.gguf"))
            (root / gemma.name).symlink_to(gemma)
        else:
            path = sources[name]()
            (root / name).mkdir()
            (root / name / path.name).symlink_to(path)
    return root


@pytest.fixture(scope="module")
def lan() -> Any:
    reason = lan_unusable(TAG)
    if reason:
        pytest.skip(f"peers across network namespaces: {reason}")
    net = Lan(TAG, SUBNET)
    try:
        net.create()
        for _ in range(5):
            net.add_host()
        yield net
    finally:
        net.destroy()


class Forger:
    def __init__(self, lan: Lan, log: Path, relay: str) -> None:
        host = lan.hosts[4]
        self.log = log
        self.url = f"http://{host.address}:{PORT}"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, sys.executable, str(Path(__file__).with_name("peer_forger.py")),
             "--host", host.address, "--port", str(PORT), "--relay", relay, "--log", str(log),
             "--beacon-port", str(BEACON_PORT), "--broadcast", f"10.78.{SUBNET}.255"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    def received(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def members(lan: Lan, module_servers: ServerFactory, gemma_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A, B, C, D and the forger, as the module's docstring lays them out (B's models loaded)."""
    root = tmp_path_factory.mktemp("peer-models")
    url = {name: f"http://{host.address}:{PORT}" for name, host in zip("abcdf", lan.hosts, strict=True)}
    # Settings every member needs for these tests, besides a user's defaults: the key; the LAN's
    # beacon port (away from 13305, so no real server or scan on this machine hears them); beacons on
    # (test servers have them off), so that `peers: "auto"` has something to hear.
    lan_env = {"LEMONADE_PEER_KEY": KEY, "LEMONADE_BEACON_PORT": str(BEACON_PORT), "LEMONADE_BROADCAST": "true"}

    def start(name: str, *models: str, env: dict[str, str] | None = None, peers: list[str] | None = None) -> Server:
        host = lan.hosts["abcdf".index(name)]
        return module_servers(env={**lan_env, "LEMONADE_EXTRA_MODELS_DIR": str(models_dir(root / name, gemma_dir,
                                                                                         *models)), **(env or {})},
                              config={"peers": peers} if peers else None, netns=host.ns, host=host.address, port=PORT,
                              wait=False)

    forger: Forger | None = None
    try:
        b = start("b", GEMMA_NAME, EMBED)
        c = start("c", GEMMA_NAME, RERANK)
        a = start("a", EMBED, peers=[url["b"], url["c"], url["f"]])
        d = start("d", env={"LEMONADE_PEER_KEY": OTHER_KEY}, peers=[url["a"], url["b"]])
        b.wait_live(120)
        # The forger relays to B, so it starts once B answers: a relay that found B not listening yet
        # would be refused for that (and asked again only 30 s later), not for being a relay.
        forger = Forger(lan, root / "forger.log", relay=url["b"])
        for server in (c, a, d):
            server.wait_live(120)
        with b.client() as http:
            for name in (GEMMA_NAME, EMBED):
                assert http.post("/v1/load", json={"model_name": name}).status_code == 200
        yield {"a": a, "b": b, "c": c, "d": d, "forger": forger}
    finally:
        if forger is not None:
            forger.stop()


def peers_of(server: Server) -> dict[str, dict[str, Any]]:
    health = httpx.get(server.url + "/v1/health", timeout=60).json()
    return {p["url"]: p for p in health["peers"]["members"]}


def requests_of(server: Server, model: str, endpoint: str) -> float:
    """The server's own count of inference requests for `model` at `endpoint` (/metrics)."""
    text = httpx.get(server.url + "/metrics", timeout=60).text
    needle = f'lemonade_model_requests_total{{endpoint="{endpoint}",model="{model}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(needle))


def wait_up(a: Server, *servers: Server) -> dict[str, dict[str, Any]]:
    """A's view of its peers once each of `servers` is up there with its loaded models listed."""
    def ready() -> dict[str, dict[str, Any]] | None:
        seen = peers_of(a)
        return seen if all(seen.get(s.url, {}).get("state") == "up" for s in servers) else None
    return wait_for(ready, timeout=60, what="peers up")


def test_models_of_the_lan_listed_with_where_they_live(members):
    a, b, c, forger = members["a"], members["b"], members["c"], members["forger"]
    wait_up(a, b, c)
    seen = wait_for(lambda: (p := peers_of(a))[b.url]["loaded"] == sorted([GEMMA_NAME, EMBED]) and p,
                    timeout=30, what="B's loaded models seen by A")  # as of A's next poll
    assert seen[forger.url]["state"] == "refused" and "relay" in seen[forger.url]["error"], seen[forger.url]
    listed = {m["id"]: m for m in openai.OpenAI(base_url=a.url + "/v1", api_key="x").models.list().model_dump()["data"]}
    assert "peer" not in listed[EMBED]  # A's own model
    assert listed[GEMMA_NAME]["peer"] == b.url and listed[GEMMA_NAME]["peer_loaded"]  # B has it loaded, C not
    assert listed[RERANK]["peer"] == c.url and not listed[RERANK]["peer_loaded"]
    one = httpx.get(a.url + f"/v1/models/{RERANK}", timeout=60).json()
    assert one["id"] == RERANK and one["peer"] == c.url


def test_the_peer_that_has_the_model_answers_on_every_api(members):
    a, b, c = members["a"], members["b"], members["c"]
    wait_up(a, b, c)
    before = requests_of(b, GEMMA_NAME, "chat/completions")
    oai = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=300)
    reply = oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    stream = oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=8, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    parts = ollama.Client(host=a.url, timeout=300).chat(model=GEMMA_NAME, messages=HELLO, stream=True,
                                                        options={"num_predict": 8})
    assert "".join(part.message.content or "" for part in parts)
    with anthropic.Anthropic(base_url=a.url, api_key="x", max_retries=0, timeout=300).messages.stream(
            model=GEMMA_NAME, max_tokens=8, messages=HELLO) as events:
        assert "".join(events.text_stream)
    result = call(a, "lemonade_chat", {"model": GEMMA_NAME, "messages": HELLO, "max_tokens": 8})  # MCP
    assert not result.is_error and "".join(texts(result)), result
    # every one of them was answered by B's engine
    assert requests_of(b, GEMMA_NAME, "chat/completions") - before == 5
    # A has all-MiniLM too, but B has it loaded: B embeds
    embedded = requests_of(b, EMBED, "embeddings")
    vectors = oai.embeddings.create(model=EMBED, input=["a cat", "a dog"]).data
    assert len(vectors) == 2 and len(vectors[0].embedding) == 384
    assert requests_of(b, EMBED, "embeddings") - embedded == 1
    # the reranker is C's alone: C loads it and answers
    ranked = httpx.post(a.url + "/v1/rerank", timeout=300, json={"model": RERANK, "query": "q",
                                                                 "documents": ["x", "y"]})
    assert ranked.status_code == 200 and [r["index"] for r in ranked.json()["results"]] == [0, 1], ranked.text
    assert requests_of(c, RERANK, "rerank") == 1
    assert a.engine_pids() == []  # A itself ran nothing
    # A's health says where its requests went: bound peer models, no process
    loaded = httpx.get(a.url + "/v1/health", timeout=60).json()["all_models_loaded"]
    where = {m["model_name"] for m in loaded}
    assert f"{GEMMA_NAME}@{b.url.removeprefix('http://')}" in where, loaded


def test_no_key_no_entry(members):
    """D holds another key; the forger none (and relays B's own answers): neither gets a session, a
    model or a request, and the key never reaches them. A forwarded request with a made-up session
    is refused."""
    a, b, d, forger = members["a"], members["b"], members["d"], members["forger"]
    seen = wait_for(lambda: (p := peers_of(d)) and all(x["state"] == "refused" for x in p.values()) and p,
                    timeout=60, what="D refused by A and B")
    assert set(seen) == {a.url, b.url}
    assert all("did not prove" in p["error"] for p in seen.values()), seen
    assert GEMMA_NAME not in {m["id"] for m in httpx.get(d.url + "/v1/models", timeout=60).json()["data"]}
    refused = httpx.post(d.url + "/v1/chat/completions", timeout=60, json={"model": GEMMA_NAME, "messages": HELLO})
    assert refused.status_code == 404, refused.text
    for server in (a, b):
        sessions = httpx.get(server.url + "/v1/health", timeout=60).json()["peers"]["sessions_from"]
        assert not any(d.url.removeprefix("http://").split(":")[0] in s for s in sessions), sessions
    forged = httpx.post(b.url + "/v1/chat/completions", timeout=60, headers={"X-Lemonade-Peer": "0" * 64},
                        json={"model": GEMMA_NAME, "messages": HELLO, "max_tokens": 2})
    assert forged.status_code == 401 and "LEMONADE_PEER_KEY" in forged.json()["error"]["message"]
    listing = httpx.get(b.url + "/peers/models", timeout=60)
    assert listing.status_code == 401
    received = forger.received()
    assert received and {(r["method"], r["path"]) for r in received} == {("POST", "/peers/challenge")}
    assert not any(KEY in json.dumps(r) for r in received)
    assert not any("x-lemonade-peer" in {k.lower() for k in r["headers"]} for r in received)


def test_a_killed_peer_costs_at_most_one_failed_attempt(members):
    """B dies with Gemma and all-MiniLM loaded. Gemma's next request goes to the next peer with it
    (C, which loads it); all-MiniLM's is served by A itself, the only other server that has it;
    after that B is skipped: no further attempts, and no request waits for it."""
    a, b, c = members["a"], members["b"], members["c"]
    wait_up(a, b, c)
    oai = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=300)
    oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=2)  # bound to B
    b.children()  # its engines, remembered by pid before it goes
    os.kill(b.proc.pid, signal.SIGKILL)
    b.proc.wait(30)
    for pid in b.children():  # its engines die with it (PR_SET_PDEATHSIG)
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(30)
    reply = oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=4)
    assert reply.choices[0].message.content
    failed = peers_of(a)[b.url]["failed_attempts"]
    assert failed <= 1 and peers_of(a)[b.url]["state"] == "down"
    assert requests_of(c, GEMMA_NAME, "chat/completions") == 1  # the next peer answered
    stream = oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=4, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert requests_of(c, GEMMA_NAME, "chat/completions") == 2
    assert a.engine_pids() == []
    vectors = oai.embeddings.create(model=EMBED, input=["a cat"]).data  # served here: B is gone
    assert len(vectors[0].embedding) == 384
    assert a.engine_pids() != [] and requests_of(a, EMBED, "embeddings") == 1
    assert peers_of(a)[b.url]["failed_attempts"] <= failed + 1
    oai.embeddings.create(model=EMBED, input=["a dog"])
    oai.chat.completions.create(model=GEMMA_NAME, messages=HELLO, max_tokens=2)
    after = peers_of(a)[b.url]["failed_attempts"]
    assert after <= 2 and after == peers_of(a)[b.url]["failed_attempts"]


def test_auto_finds_the_live_servers_by_their_beacons(members):
    """With `peers: "auto"` (set live), A takes the servers it hears: C answers, A finds itself and
    skips it, and the forger's beacon leads nowhere."""
    a, c, forger = members["a"], members["c"], members["forger"]
    with a.client() as http:
        assert http.post("/internal/set", json={"peers": "auto"}).status_code == 200
    wait_for(lambda: (p := peers_of(a)) and p.get(c.url, {}).get("state") == "up"
                    and p.get(forger.url, {}).get("state") == "refused" and p.get(a.url, {}).get("state") == "self"
                    and p, timeout=60, what="A's peers heard by beacon")
    reply = openai.OpenAI(base_url=a.url + "/v1", api_key="x", max_retries=0, timeout=300).chat.completions.create(
        model=GEMMA_NAME, messages=HELLO, max_tokens=4)
    assert reply.choices[0].message.content
    assert {(r["method"], r["path"]) for r in forger.received()} == {("POST", "/peers/challenge")}
    assert not any(KEY in json.dumps(r) for r in forger.received())


def test_a_peer_dying_mid_stream_ends_the_stream_with_an_error(members):
    """C streams Gemma's answer through A and dies after its first tokens: the client's stream ends
    with an error event naming C (it does not hang), and A's next request for Gemma, which no live
    server has now, is answered at once with a 404, not held for C."""
    a, c = members["a"], members["c"]
    wait_up(a, c)
    body = {"model": GEMMA_NAME, "messages": HELLO, "max_tokens": 400, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, connect=10)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:  # C is answering: it goes, its engine with it (PR_SET_PDEATHSIG)
                    os.kill(c.proc.pid, signal.SIGKILL)
    c.proc.wait(30)
    assert len(events) < 400 and events[-1] != "[DONE]", events[-3:]
    error = json.loads(events[-1])["error"]
    assert c.url.removeprefix("http://") in error["message"], error
    gone = httpx.post(a.url + "/v1/chat/completions", timeout=60, json={"model": GEMMA_NAME, "messages": HELLO})
    assert gone.status_code == 404, gone.text
