"""Never out of memory (issue 39): the real server inside a memory-capped host, under a random workload.

The test makes a memory cgroup (v2 or v1, tests/cgroups.py) capped at CAP_MIB, starts the server in
it with the shipped defaults (auto-tune's 8 slots and all), and for a minute runs a bounded,
seeded random workload over every offline model the suite has: Gemma 3 270M (chat, `ctx_size` in
{2048, 8192, 32768, -1} on explicit loads, 1 to 8 concurrent clients with prompts up to the
context), MiniLM (embeddings), Whisper tiny.en on faster-whisper (speech in) and Piper (speech out),
with loads, unloads and requests interleaved. It asserts that the kernel killed nothing (the
cgroup's own `oom_kill` counter), that no engine crashed, that every answer was served or refused
with 507 `insufficient_memory` before anything started, and that afterwards every model still loads
and answers.

The cap is one that the same workload breaks without admission. Measured on this machine (2 cores,
cgroup v1, 2026-12-06) with the code before it (commit 24a9660, this test and seed): at 700 MiB the
cgroup reached its cap, the kernel's OOM killer ended Gemma's llama-server twice (exit -9) and all 7
requests of an 8-client burst got 502 `backend_crashed`; at 900 MiB nothing was killed, but the
cgroup sat at its cap reclaiming the models' mapped weights, and 150 s of it served 18 requests.
With admission, at 700 MiB: cgroup peak 647 MiB, no kill, no crash, 55 requests served and 14
refused with 507 (the 8192 and 32768 contexts, and chats while they did not fit).
Where no memory cgroup can be made (not root, no controller), the test says so and skips; CI runs
as root and makes one.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.cgroups import CgroupUnavailable, join, memory_cgroup
from tests.gguf_factory import write_gguf
from tests.helpers import (
    PIPER,
    WHISPER,
    cli_env,
    installed_backend,
    lemonade,
    loaded,
    ok,
    publish_piper,
    publish_whisper,
    wait_for,
)
from tests.models import minilm_gguf
from tests.speech import SENTENCE, speak

CAP_MIB = 700
# How long the workload runs: every kind of operation and every context once, then random batches until
# this many seconds from its start (each operation that starts in time finishes). 60 s (150 s until
# 2026-12-07) keeps the suite within its CI budget; a longer run: LEMONADE_TEST_WORKLOAD_SECONDS=600,
# other seeds: LEMONADE_TEST_SEED.
SECONDS = float(os.environ.get("LEMONADE_TEST_WORKLOAD_SECONDS", "60"))
SEED = int(os.environ.get("LEMONADE_TEST_SEED", "39"))
GEMMA, MINILM = "gemma-3-270m-q4_k_m", "all-MiniLM-L6-v2"
ENGINES = ("llamacpp", "fasterwhisper", "piper")
WORDS = ("lemon tree garden river stone cloud market window yellow quiet morning story bridge paper candle "
         "winter orange harbor valley music north signal copper forest").split()


@pytest.fixture(scope="module")
def capped(module_servers, hub_server, gemma_dir, whisper_backend, whisper_ct2_dir, tmp_path_factory):
    installed_backend("piper")
    publish_whisper(hub_server, whisper_ct2_dir)
    publish_piper(hub_server)
    extra = tmp_path_factory.mktemp("capped-models")
    (extra / f"{GEMMA}.gguf").symlink_to(next(gemma_dir.glob("*.gguf")))
    (extra / f"{MINILM}.gguf").symlink_to(minilm_gguf())
    # a GGUF whose header reads well but whose tensors are cut off: llama-server fails to load it
    broken = write_gguf(extra / "broken-model.gguf", "llama", meta={"block_count": 2, "embedding_length": 64,
                                                                   "attention.head_count": 4})
    broken.write_bytes(broken.read_bytes()[:-16])
    try:
        group = memory_cgroup(f"lemonade-test-memory-{os.getpid()}", CAP_MIB << 20)
        cgroup = group.__enter__()
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory-capped host can be made here: {exc}")
    try:
        # log_level debug: the engines' own output goes to server.log too, so a rare failure of this random
        # workload can be read afterwards (it is how its 8-minute hang was explained: docs/warm-swaps.md,
        # "One request per slot"); nothing else changes with the level
        server = module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(extra),
                                     "LEMONADE_LOG_LEVEL": "debug"}, engines=ENGINES, cgroup=cgroup)
        yield server, cgroup
    finally:
        for s in module_servers.servers:
            s.stop()
        group.__exit__(None, None, None)


def words(n: int, seed: int) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] + str(i % 13) for i in range(n))


class Workload:
    """The random operations, and every answer they got."""

    def __init__(self, url: str, wav: bytes, seed: int) -> None:
        self.url = url
        self.wav = wav
        self.rng = random.Random(seed)
        self.answers: Counter[str] = Counter()
        self.bad: list[str] = []
        self.contexts: list[int] = []

    def note(self, what: str, resp: httpx.Response) -> None:
        if resp.status_code == 200:
            self.answers[f"{what} 200"] += 1
            return
        code = None
        try:
            code = resp.json().get("error", {}).get("code")
        except ValueError:
            pass
        self.answers[f"{what} {resp.status_code} {code}"] += 1
        if not (resp.status_code == 507 and code == "insufficient_memory"):
            self.bad.append(f"{what}: {resp.status_code} {resp.text[:300]}")

    async def gemma_context(self, c: httpx.AsyncClient) -> int:
        """The loaded Gemma's context, or the smallest an automatic load can get."""
        for m in (await c.get("/v1/health")).json()["all_models_loaded"]:
            if m["model_name"] == GEMMA and m.get("context_length"):
                return int(m["context_length"])
        return 2048

    async def load(self, c: httpx.AsyncClient) -> None:
        ctx = self.contexts.pop() if self.contexts else self.rng.choice([2048, 8192, 32768, -1])
        self.note(f"load ctx {ctx}", await c.post("/v1/load", json={"model_name": GEMMA, "ctx_size": ctx}))

    async def chats(self, c: httpx.AsyncClient) -> None:
        ctx = await self.gemma_context(c)
        clients = self.rng.randint(1, 8)
        # prompts up to the context they share (a unified cache), at most 1,500 tokens each (2 cores)
        most = max(16, min(1500, int(ctx * 0.6 / clients)))

        async def one(i: int) -> None:
            n = self.rng.randint(8, most)
            body = {"model": GEMMA, "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": words(int(n / 1.6), seed=i)}]}
            self.note(f"chat x{clients}", await c.post("/v1/chat/completions", json=body))

        await asyncio.gather(*(one(i) for i in range(clients)))

    async def embed(self, c: httpx.AsyncClient) -> None:
        inputs = [words(self.rng.randint(4, 60), seed=i) for i in range(self.rng.randint(1, 4))]
        self.note("embed", await c.post("/v1/embeddings", json={"model": MINILM, "input": inputs}))

    async def transcribe(self, c: httpx.AsyncClient) -> None:
        self.note("transcribe", await c.post("/v1/audio/transcriptions", data={"model": WHISPER},
                                             files={"file": ("speech.wav", self.wav, "audio/wav")}))

    async def speak(self, c: httpx.AsyncClient) -> None:
        self.note("speak", await c.post("/v1/audio/speech", json={"model": PIPER, "voice": "joe",
                                                                  "input": "The lemon tree is in the garden."}))

    async def unload(self, c: httpx.AsyncClient) -> None:
        name = self.rng.choice([GEMMA, MINILM, WHISPER, PIPER])
        resp = await c.post("/v1/unload", json={"model_name": name})
        self.answers[f"unload {resp.status_code}"] += 1  # 404 when it was not loaded: no memory matter

    async def run(self, seconds: float) -> None:
        """Every kind of operation once, each context once, in a shuffled order (so a short run covers
        them all), then random batches of one to three operations at once until `seconds` pass."""
        kinds = [self.chats, self.chats, self.embed, self.transcribe, self.speak, self.unload]
        first = [self.load] * 4 + kinds
        self.rng.shuffle(first)
        self.contexts = [2048, 8192, 32768, -1]
        self.rng.shuffle(self.contexts)
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=self.url, timeout=900) as c:
            for i in range(0, len(first), 2):  # two at a time: a load meets traffic for other models
                await asyncio.gather(*(op(c) for op in first[i:i + 2]))
            while time.monotonic() < deadline:
                batch = [self.rng.choice([self.load, *kinds]) for _ in range(self.rng.randint(1, 3))]
                await asyncio.gather(*(op(c) for op in batch))


def test_a_random_workload_in_a_capped_host_kills_nothing_and_every_model_still_answers(capped, tmp_path):
    server, cgroup = capped
    wav = speak(SENTENCE, tmp_path / "s.wav").read_bytes()
    work = Workload(server.url, wav, SEED)
    asyncio.run(work.run(SECONDS))
    with server.client(timeout=900) as http:
        health = http.get("/v1/health").json()
        crashed = [c["message"] for c in health["crashed_models"]]
        print(f"seed {SEED}; cgroup peak {cgroup.peak_bytes() >> 20} MiB of {CAP_MIB}; OOM kills {cgroup.oom_kills()}; "
              f"crashed {crashed}; answers {dict(sorted(work.answers.items()))}")
        # the budget is the cgroup's, read from the kernel, not the machine's RAM
        info = http.get("/v1/system-info").json()
        assert info["memory_budget_set_by_cgroup"] is True
        assert info["cgroup_memory_limit_gb"] == pytest.approx(CAP_MIB / 1024, abs=0.01)
        assert info["memory_cap_gb"] <= CAP_MIB / 1024 + 0.01
        assert cgroup.oom_kills() == 0, f"the kernel killed {cgroup.oom_kills()}: {health['crashed_models']}"
        assert health["crashed_models"] == []
        assert work.bad == [], "answers that were neither served nor refused for memory:\n" + "\n".join(work.bad)
        assert any(k.endswith(" 200") and k.startswith("chat") for k in work.answers)

        # afterwards every model loads (the others make room) and answers; Gemma with `ctx_size: -1`, the
        # largest context that fits now (the workload's explicit loads leave it asking for what they asked,
        # and the server's own memory in the cgroup varies from run to run by tens of MiB)
        for name, path, body in [
                (GEMMA, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}),
                (MINILM, "/v1/embeddings", {"input": ["the lemon tree"]}),
                (PIPER, "/v1/audio/speech", {"input": "Done.", "voice": "joe"})]:
            resp = http.post("/v1/load", json={"model_name": name, **({"ctx_size": -1} if name == GEMMA else {})})
            assert resp.status_code == 200, resp.text
            resp = http.post(path, json={"model": name, **body})
            assert resp.status_code == 200, resp.text
        resp = http.post("/v1/audio/transcriptions", data={"model": WHISPER},
                         files={"file": ("speech.wav", wav, "audio/wav")})
        assert resp.status_code == 200 and "bring these things" in resp.json()["text"], resp.text
        assert cgroup.oom_kills() == 0
        assert http.get("/v1/health").json()["crashed_models"] == []


def test_a_load_that_cannot_fit_is_refused_before_any_process_starts(capped):
    """A context no budget here can hold: 507 naming the model, what it needs, what is free and what
    would make it fit; no engine was started for it."""
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        before = set(server.engine_pids())
        resp = http.post("/v1/load", json={"model_name": GEMMA, "ctx_size": 131072,
                                           "llamacpp_args": "-np 8 -kvu"})
        assert resp.status_code == 507, resp.text
        err = resp.json()["error"]
        assert err["code"] == "insufficient_memory"
        assert GEMMA in err["message"] and "memory cgroup" in err["message"] and "ctx_size" in err["message"]
        assert set(server.engine_pids()) == before
        # the same model at a context that fits still loads
        assert http.post("/v1/load", json={"model_name": GEMMA, "ctx_size": 2048}).status_code == 200


def test_a_request_that_would_auto_load_a_model_too_big_gets_the_same_507(capped):
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        resp = http.post("/v1/chat/completions", json={"model": GEMMA, "ctx_size": 131072, "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "Hello"}]})
        assert resp.status_code == 507, resp.text
        assert resp.json()["error"]["code"] == "insufficient_memory"


def test_recipes_this_host_cannot_hold_are_listed_and_hidden_from_the_backends_list(capped):
    """The catalog's filter reads the same budget: in a 900 MiB container, models of several GB are not
    offered, and a recipe left with none is in `unavailable_recipes` with its reason; `lemonade
    backends` hides it unless --all (as Lemonade's CLI does)."""
    server, cgroup = capped
    with server.client() as http:
        info = http.get("/v1/system-info").json()
        listed = {m["id"] for m in http.get("/v1/models", params={"show_all": "true"}).json()["data"]}
    # vLLM's smallest catalog model is 1.8 GB; every other recipe has one that fits 80 % of 900 MiB
    assert info["unavailable_recipes"] == ["vllm"]
    assert "needs more memory than this server offers" in info["unavailable_recipe_reasons"]["vllm"]
    assert "SDXL-Turbo" not in listed and "Whisper-Large-v3" not in listed and GEMMA in listed
    env = cli_env(server.cache, server.url)
    shown = ok(lemonade("backends", "--json", env=env)).stdout
    assert '"vllm"' not in shown and '"llamacpp"' in shown
    assert '"vllm"' in ok(lemonade("backends", "--all", "--json", env=env)).stdout


def test_memory_pressure_in_the_container_evicts_an_idle_model(capped):
    """auto_evict on a machine without a GPU watches the budget's memory: the cgroup's. At a threshold
    below what the loaded model already holds, the idle model is unloaded within a few samples."""
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        assert http.post("/v1/load", json={"model_name": GEMMA, "ctx_size": 2048}).status_code == 200
        # auto_evict with a threshold this load already passes (defaults: off, 0.90), for this test only
        assert http.post("/v1/params", json={"auto_evict": True, "auto_evict_threshold_pct": 0.2}).status_code == 200
        try:
            wait_for(lambda: http.get("/v1/health").json()["queue"]["pressure_evictions_total"] >= 1, timeout=60)
            assert GEMMA not in loaded(http)
        finally:
            http.post("/v1/params", json={"auto_evict": False, "auto_evict_threshold_pct": 0.9})


def test_an_automatic_context_sized_to_the_container_holds_a_prompt_of_three_quarters_of_it(capped):
    """`ctx_size: -1` in the container: the context chosen to fit the cgroup's memory is really usable.
    A prompt of 3/4 of it answers (the KV pages a full context touches were counted, not only those of
    an empty cache), and the kernel killed nothing. (The uncapped case, where the automatic context is
    the model's trained 32,768 tokens, is the same engine and rule; a 24,000-token prompt there took
    3-4 minutes of the suite's 2 cores: tests/test_context.py checks that every API states the
    engine's context.)"""
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        resp = http.post("/v1/load", json={"model_name": GEMMA, "ctx_size": -1})
        assert resp.status_code == 200, resp.text
        context = resp.json()["context_length"]
        kills = cgroup.oom_kills()
        sample = words(1000, 3)
        per_word = len(http.post("/api/v1/tokenize", json={"model": GEMMA, "content": sample}).json()["tokens"]) / 1000
        prompt = words(int(context * 3 / 4 / per_word), 3)
        resp = http.post("/v1/chat/completions", json={
            "model": GEMMA, "max_tokens": 8, "messages": [{"role": "user", "content": prompt + "\nSay one word."}]})
        assert resp.status_code == 200, resp.text
        used = resp.json()["usage"]["prompt_tokens"]
        assert context * 0.7 < used < context, (used, context)  # really about 3/4 of the stated context
        assert cgroup.oom_kills() == kills
        assert http.get("/v1/health").json()["crashed_models"] == []


_HOG = """
import sys, time
held = []
for _ in range(int(sys.argv[1])):
    held.append(bytearray(16 << 20))  # touched: bytearray zero-fills
print("holding", flush=True)
time.sleep(60)
"""


def test_an_engine_the_kernel_kills_anyway_is_reported_as_an_out_of_memory_kill(capped, tmp_path):
    """Something else in the container (a program the server does not know of) takes the memory the
    engine was admitted with: the kernel's OOM killer ends the engine mid-stream. The stream ends at
    once with an error event that names the out-of-memory kill, health says so, and the next request
    loads the model again."""
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        assert http.post("/v1/load", json={"model_name": GEMMA, "ctx_size": 2048}).status_code == 200
        # the kernel's choice made certain: the engine goes first (raising a score needs no privilege)
        Path(f"/proc/{loaded(http)[GEMMA]['pid']}/oom_score_adj").write_text("1000")
        kills = cgroup.oom_kills()
        body = {"model": GEMMA, "stream": True, "max_tokens": 4000, "temperature": 1.0,
                "messages": [{"role": "user", "content": "Tell me a very long story about a lemon tree."}]}
        hog: subprocess.Popen[bytes] | None = None
        try:
            with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                lines = resp.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert "choices" in first
                # more than the cap leaves beside the anonymous memory already in it (page cache gives way)
                free = (CAP_MIB << 20) - cgroup.anon_bytes()
                hog = subprocess.Popen([sys.executable, "-c", _HOG, str(free // (16 << 20) + 8)],
                                       preexec_fn=lambda: join(cgroup), stdout=subprocess.PIPE)
                rest = "\n".join(lines)
            assert "event: error" in rest and "out-of-memory" in rest, rest[-800:]
        finally:
            if hog is not None:
                hog.kill()
                hog.wait(10)
        assert cgroup.oom_kills() > kills
        crashed = http.get("/v1/health").json()["crashed_models"]
        assert crashed and crashed[0]["oom_killed"] is True and "out-of-memory" in crashed[0]["message"]
        resp = http.post("/v1/chat/completions", json={"model": GEMMA, "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "Hello"}]})
        assert resp.status_code == 200, resp.text


def test_a_load_that_fails_unloads_the_other_models_and_is_tried_once_more(capped):
    """Lemonade's failed-load rule (multi-model guide, Eviction Policy 3): a load that fails for any
    reason but a missing file unloads every model and is retried; a pinned model stays (a pin outranks
    the rule here, docs/memory.md)."""
    server, cgroup = capped
    with server.client(timeout=900) as http:
        http.post("/v1/unload", json={})
        assert http.post("/v1/load", json={"model_name": MINILM}).status_code == 200
        assert http.post("/v1/load", json={"model_name": PIPER, "pinned": True}).status_code == 200
        resp = http.post("/v1/load", json={"model_name": "broken-model"})
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "model_load_error", resp.text
        assert set(loaded(http)) == {PIPER}
        logs = server.log()
        assert "Loading broken-model failed" in logs and "trying once more" in logs
        http.post("/v1/unload", json={})
