"""Long prompts behind an idle timeout, and clients that leave during the prompt (issue 40, part 5).

Why: llama-server sends nothing between its headers and the first token, and a 4,000-token prompt
takes seconds to read on a CPU, so a client or proxy that gives up on a silent connection never got
its answer (lemonade#1364); and a client that leaves while the engine reads its prompt should not
keep the engine busy. On the real Gemma 3 270M, through our server and, as the reference, straight
to the engine our server started (same binary, same arguments, same slots), it measures:

1. **Keep-alive**: `--requests` streamed chat completions of a `--prompt-tokens` prompt (each with
   a number of its own in front, so the engine's prompt cache never shortens one), one after
   another, each by a client that gives up after 5 s without a byte (httpx read timeout 5 s). It
   prints how many complete on each side, the time to the first byte and to the first token, and
   the keep-alives a client received.
2. **Disconnect during the prompt**: on every streaming surface (OpenAI chat, completions, Responses,
   Anthropic messages, Ollama chat and generate; the engine's own chat endpoint as the reference)
   `--leaves` clients send such a prompt and hang up (close the connection) at a random moment
   1-3 s after the engine started it. From the hang-up it measures the time to the engine's log
   line `stop: cancel task` (it noticed) and to its `slot release` (its work on the request ended).
   The engine's own log timestamps (microseconds since it started) are put on our clock by the
   server's `/logs/stream`, which stamps each line as it arrives (the smallest difference of the
   two clocks over all lines is the offset). The engine is not asked anything meanwhile: any
   request to llama-server wakes its HTTP threads, and a waiting one checks whether its client is
   gone only after a whole second without such a wake-up (docs/performance.md, "Long prompts").
   A hang-up that came after the prompt was read (the engine's `progress = 1.00`) is not counted.

It never asserts; figures depend on the machine. Results: docs/performance.md ("Long prompts").

    .venv/bin/python benchmarks/bench_prefill_keepalive.py [--requests 20] [--leaves 5]
        [--prompt-tokens 4000] [--engine-args '-b 256 -ub 256'] [--keep]

Every process it starts is stopped by pid at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import (  # noqa: E402 - sibling module, not a package
    GEMMA_NAME,
    Processes,
    backend_dir,
    free_port,
    gemma_dir,
    lemonade_env,
    load_avg,
    new_cache,
    pct,
    serve_argv,
    wait_ok,
)

CLIENT_GIVES_UP_S = 5.0
# surface: (path, body with "{prompt}" where the prompt goes)
SURFACES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "{prompt}"}],
                                             "max_tokens": 2000, "stream": True}),
    "openai completions": ("/v1/completions", {"prompt": "{prompt}", "max_tokens": 2000, "stream": True}),
    "openai responses": ("/v1/responses", {"input": "{prompt}", "max_output_tokens": 2000, "stream": True}),
    "anthropic messages": ("/v1/messages", {"messages": [{"role": "user", "content": "{prompt}"}],
                                            "max_tokens": 2000, "stream": True}),
    "ollama chat": ("/api/chat", {"messages": [{"role": "user", "content": "{prompt}"}], "stream": True,
                                  "options": {"num_predict": 2000}}),
    "ollama generate": ("/api/generate", {"prompt": "{prompt}", "stream": True, "options": {"num_predict": 2000}}),
}
ENGINE_TS = re.compile(r"^(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) ")
LAUNCH = re.compile(r"launch_slot_: id +(\d+) \| task (\d+) \|")
CANCEL = re.compile(r"stop: cancel task, id_task = (\d+)")
RELEASE = re.compile(r"release: id +\d+ \| task (\d+) \|")
PROMPT_DONE = re.compile(r"id +\d+ \| task (\d+) \| prompt processing, .*progress = 1\.00")


class Prompts:
    """Prompts of about `tokens` tokens (Gemma's tokenizer reads "lemon " as one token), each with a
    number in front that no earlier prompt of the run had."""

    def __init__(self, tokens: int) -> None:
        self.words = max(tokens - 20, 1)  # the chat template and the question add about 20
        self.n = random.randrange(10**6)

    def __call__(self) -> str:
        self.n += 1
        return f"{self.n} " + "lemon " * self.words + "\nHow many lemons?"


def fill(body: Any, prompt: str) -> Any:
    if isinstance(body, dict):
        return {k: fill(v, prompt) for k, v in body.items()}
    if isinstance(body, list):
        return [fill(v, prompt) for v in body]
    return prompt if body == "{prompt}" else body


# ----- the engine's log on our clock --------------------------------------------------------------

@dataclass
class EngineLog:
    """The engine's lines from our server's `/logs/stream`, each with its wall time."""

    lines: list[tuple[float, float, str]] = field(default_factory=list)  # (engine s, arrival wall s, text)
    offset: float = float("inf")  # wall = engine + offset; the smallest arrival delay over all lines
    new_line: asyncio.Event = field(default_factory=asyncio.Event)
    failed: BaseException | None = None  # why the log stream ended

    def add(self, entry: dict[str, Any]) -> None:
        text = entry["line"].partition(f"({entry['tag']}) ")[2]  # the line as the engine wrote it
        match = ENGINE_TS.match(text)
        if not entry["tag"].startswith("engine.") or match is None:
            return
        m, s, ms, us = (int(g) for g in match.groups())
        engine = m * 60 + s + ms / 1e3 + us / 1e6
        wall = datetime.strptime(entry["timestamp"], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        self.offset = min(self.offset, wall - engine)
        self.lines.append((engine, wall, text))
        self.new_line.set()

    def wall(self, engine: float) -> float:
        return engine + self.offset

    async def find(self, pattern: re.Pattern[str], task: str | None = None, after: int = 0,
                   timeout: float = 600.0) -> tuple[int, float, re.Match[str]]:
        """The first line from index `after` on that matches (and names `task`): (index, engine s, match)."""
        deadline = time.monotonic() + timeout
        i = after
        while True:
            if self.failed is not None:
                raise RuntimeError(f"the server's log stream ended: {self.failed!r}")
            while i < len(self.lines):
                engine, _, text = self.lines[i]
                match = pattern.search(text)
                if match is not None and (task is None or match.group(match.re.groups) == task):
                    return i, engine, match
                i += 1
            self.new_line.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no engine line like {pattern.pattern!r}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.new_line.wait(), left)


async def follow_logs(ws_url: str, log: EngineLog) -> None:
    try:
        async with websockets.connect(ws_url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
            async for message in ws:
                data = json.loads(message)
                for entry in data.get("entries", []) if data["type"] == "logs.snapshot" else [data.get("entry")]:
                    if entry:
                        log.add(entry)
        raise ConnectionError("closed by the server")
    except Exception as exc:  # told to whoever waits for a line
        log.failed = exc
        log.new_line.set()


# ----- 1: a client that gives up after 5 s without a byte -------------------------------------------

async def patient_client(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request by a client whose read timeout is 5 s."""
    started = time.perf_counter()
    out: dict[str, Any] = {"ok": False, "first_byte": None, "first_token": None, "keepalives": 0, "prompt_n": None}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_GIVES_UP_S)) as c, \
                c.stream("POST", url + path, json=body) as resp:
            async for line in resp.aiter_lines():
                now = time.perf_counter() - started
                if out["first_byte"] is None:
                    out["first_byte"] = now
                if line.startswith(":"):
                    out["keepalives"] += 1
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if out["first_token"] is None and any((ch.get("delta") or {}).get("content")
                                                          for ch in event.get("choices") or []):
                        out["first_token"] = now
                    if event.get("timings"):
                        out["prompt_n"] = event["timings"].get("prompt_n")
                        out["prefill_tps"] = 1000 * out["prompt_n"] / event["timings"]["prompt_ms"]
                elif line == "data: [DONE]":
                    out["ok"] = resp.status_code == 200
    except httpx.TimeoutException:
        out["gave_up"] = time.perf_counter() - started
    return out


async def keepalive_phase(sides: dict[str, str], n: int, prompts: Prompts,
                          log: EngineLog) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for i in range(n):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):  # A,B then B,A
            body = {"model": GEMMA_NAME, "messages": [{"role": "user", "content": prompts()}], "max_tokens": 8,
                    "stream": True, "ignore_eos": True}
            mark = len(log.lines)
            result = await patient_client(sides[side], "/v1/chat/completions", body)
            results[side].append(result)
            if not result["ok"]:  # the engine still reads the prompt of a client that gave up: not with the next
                await log.find(RELEASE, after=mark)
            print(f"  {side} {i + 1}/{n}: {'complete' if result['ok'] else 'gave up'}, first byte "
                  f"{fmt_s(result['first_byte'])}, first token {fmt_s(result['first_token'])}, "
                  f"{result['keepalives']} keep-alives, load {os.getloadavg()[0]:.1f}", flush=True)
    return results


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# ----- 2: a client that leaves during the prompt ----------------------------------------------------

async def leave_during_prompt(url: str, path: str, body: dict[str, Any], log: EngineLog) -> dict[str, Any] | None:
    """Send the request on a connection of our own, hang up 1-3 s after the engine started it, and
    read from the engine's log when it noticed and when its work ended (None: the prompt was read
    before the hang-up, so this one says nothing about a hang-up during the prompt)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    mark = len(log.lines)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    drain = asyncio.ensure_future(reader.read(1 << 20))  # whatever comes, keep-alives included
    try:
        at, _, launch = await log.find(LAUNCH, after=mark)
        task = launch.group(2)
        # the engine's line arrives a little after it started: wait from its own time, on our clock
        started = log.wall(log.lines[at][0])
        await asyncio.sleep(max(0.0, started + random.uniform(1.0, 3.0) - time.time()))
    finally:
        drain.cancel()
        writer.close()
        gone = time.time()
    _, released, _ = await log.find(RELEASE, task=task, after=at)
    done = next((engine for engine, _, text in log.lines[at:]
                 if (m := PROMPT_DONE.search(text)) and m.group(1) == task), None)
    if done is not None and log.wall(done) < gone:
        return None
    cancel = next((engine for engine, _, text in log.lines[at:]
                   if (m := CANCEL.search(text)) and m.group(1) == task), None)
    return {"noticed": None if cancel is None else log.wall(cancel) - gone, "stopped": log.wall(released) - gone}


async def disconnect_phase(ours: str, engine: str, leaves: int, prompts: Prompts,
                           log: EngineLog) -> dict[str, list[dict[str, Any]]]:
    cases = [("engine directly (chat)", engine, *SURFACES["openai chat"])]
    cases += [(name, ours, path, body) for name, (path, body) in SURFACES.items()]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in cases}
    skipped = dict.fromkeys(results, 0)
    for i in range(leaves):
        for name, url, path, body in cases:
            got = await leave_during_prompt(url, path, fill({"model": GEMMA_NAME, **body}, prompts()), log)
            if got is None:
                skipped[name] += 1
            else:
                results[name].append(got)
            print(f"  {name} {i + 1}/{leaves}: " + ("prompt read before the hang-up, not counted" if got is None
                  else f"noticed after {fmt_ms(got['noticed'])}, stopped after {fmt_ms(got['stopped'])}")
                  + f", load {os.getloadavg()[0]:.1f}", flush=True)
    return results


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


# ----- the run --------------------------------------------------------------------------------------

async def measure(args: argparse.Namespace, url: str, engine: str, ws_url: str) -> None:
    log = EngineLog()
    follower = asyncio.ensure_future(follow_logs(ws_url, log))
    try:
        prompts = Prompts(args.prompt_tokens)
        if args.requests:
            print(f"\n1. {args.requests} streamed chat completions of {args.prompt_tokens} tokens per side, "
                  f"each by a client that gives up after {CLIENT_GIVES_UP_S:g} s without a byte")
            sides = {"direct": engine, "ours": url}
            results = await keepalive_phase(sides, args.requests, prompts, log)
            for side, rs in results.items():
                done = [r for r in rs if r["ok"]]
                tokens = sorted({r["prompt_n"] for r in done if r["prompt_n"]})
                ttft = [r["first_token"] for r in done if r["first_token"] is not None]
                speed = [r["prefill_tps"] for r in done if r.get("prefill_tps")]
                first_byte = [r["first_byte"] for r in rs if r["first_byte"] is not None]
                print(f"= {side}: {len(done)} of {len(rs)} complete; prompt tokens {tokens[:1] + tokens[-1:]}; "
                      f"first byte p50 {fmt_s(pct(first_byte, 50) if first_byte else None)}; first token p50 "
                      f"{fmt_s(pct(ttft, 50) if ttft else None)}, max {fmt_s(max(ttft) if ttft else None)}; "
                      f"prompt read at {pct(speed, 50) if speed else float('nan'):.0f} tokens/s (p50); "
                      f"keep-alives per request {sum(r['keepalives'] for r in rs) / len(rs):.1f}")
        if args.leaves:
            print(f"\n2. {args.leaves} client(s) per surface hang up 1-3 s into the engine's reading of a "
                  f"{args.prompt_tokens}-token prompt")
            results = await disconnect_phase(url, engine, args.leaves, prompts, log)
            print(f"(engine clock to ours: offset found over {len(log.lines)} lines)")
            for name, rs in results.items():
                stopped = [r["stopped"] for r in rs]
                noticed = [r["noticed"] for r in rs if r["noticed"] is not None]
                if not stopped:
                    print(f"= {name}: no hang-up during the prompt")
                    continue
                print(f"= {name}: {len(rs)} hang-ups; engine noticed after p50 {fmt_ms(pct(noticed, 50))} "
                      f"(max {fmt_ms(max(noticed))}); engine stopped after p50 {fmt_ms(pct(stopped, 50))}, "
                      f"max {fmt_ms(max(stopped))}; within 250 ms: {sum(s <= 0.25 for s in stopped)} of "
                      f"{len(stopped)}")
    finally:
        follower.cancel()
        with contextlib.suppress(BaseException):
            await follower


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20, help="keep-alive phase: requests per side (0: skip)")
    parser.add_argument("--leaves", type=int, default=5, help="disconnect phase: hang-ups per surface (0: skip)")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--engine-args", default="", help="extra llama-server arguments for the load")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (server log)")
    args = parser.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally block stops every process we started

    signal.signal(signal.SIGTERM, on_term)
    procs = Processes()
    root = Path(tempfile.mkdtemp(prefix="bench-prefill-"))
    try:
        print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {' '.join(sys.argv)}; {os.cpu_count()} cpus, "
              f"load {load_avg()}")
        cache = new_cache(root, "cache", backend_dir())
        port = free_port()
        server = procs.start(serve_argv(port), env=lemonade_env(cache, gemma_dir()), log=root / "server.log")
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/live", server, 60)
        load: dict[str, Any] = {"model_name": GEMMA_NAME}
        if args.engine_args:
            load["llamacpp_args"] = args.engine_args
        resp = httpx.post(url + "/v1/load", json=load, timeout=600)
        if resp.status_code != 200:
            raise RuntimeError(f"load failed: {resp.status_code} {resp.text}")
        health = httpx.get(url + "/v1/health", timeout=10).json()
        loaded = next(m for m in health["all_models_loaded"] if m["model_name"] == GEMMA_NAME)
        procs.note_children(server)
        print("engine: " + " ".join(loaded["launch_command"]))
        engine = loaded["backend_url"].removesuffix("/v1")
        ws_url = f"ws://127.0.0.1:{health['websocket_port']}/logs/stream"
        asyncio.run(measure(args, url, engine, ws_url))
        print(f"load at the end: {load_avg()}")
    finally:
        procs.stop_all()
        if args.keep:
            print(f"kept: {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
