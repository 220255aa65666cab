"""An engine stand-in that speaks llama-server's HTTP protocol, for the fast test layer.

It is not a model: the answer to any prompt is `tok0 tok1 ...` (one word a token), `max_tokens`
long (8 by default), so tests can count what they get. What it does copy from llama-server b11312 is
what the server under test reads: `/health` (503 "Loading model" while it starts), `/props`
(context per request, slot count), `/slots` with `?action=save|restore|erase` into
`--slot-save-path`, `/tokenize`, `/metrics`, and `/v1/chat/completions`, `/v1/completions` and
`/v1/embeddings` answered whole or as an SSE stream closed after `data: [DONE]`, with llama.cpp's
`timings` (prompt_n, cache_n, predicted_n, ...). Each slot keeps the tokens of its last prompt, so
`cache_n` is the prefix a request shares with the slot it lands on, as in llama.cpp.

On command it misbehaves, so the router's rules can be checked against each case: a message (or
prompt) containing `STANDIN:crash` exits the process at once (code 3), `STANDIN:hang` never
answers, `STANDIN:slow=S` waits S seconds before each token, `STANDIN:fail=N` answers HTTP N.
`--memory-mb M` holds M MiB of touched memory, so a memory reading sees the engine's size;
`--exit-seconds S` goes on serving for S seconds after SIGTERM before it exits.

Only the standard library: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

COMMAND = re.compile(r"STANDIN:(crash|hang|slow|fail)(?:=([0-9.]+))?")


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.alias = args.alias
        self.ctx = args.ctx_size
        self.slots = [{"id": i, "tokens": [], "busy": False} for i in range(args.parallel)]
        self.slot_dir = Path(args.slot_save_path) if args.slot_save_path else None
        self.ready_at = time.monotonic() + args.load_seconds
        self.requests = 0
        # requests that named a slot (`id_slot`) while it served another: llama-server (b11312) then
        # loads a cached prompt into the running request's slot (runtime/slot_affinity.py says what follows)
        self.busy_slot_pins = 0
        self.lock = threading.Lock()
        self.held = bytearray(args.memory_mb << 20)
        for i in range(0, len(self.held), 4096):  # touched, so it is resident
            self.held[i] = 1

    def per_request_ctx(self) -> int:
        return self.ctx

    def take_slot(self, tokens: list[str], wanted: int | None) -> tuple[dict[str, Any], int]:
        """The slot a request lands on (`id_slot`, else the idle one sharing the longest prefix), and
        how many of its prompt tokens that slot has cached."""
        with self.lock:
            idle = [s for s in self.slots if not s["busy"]]
            if wanted is not None and 0 <= wanted < len(self.slots):
                slot = self.slots[wanted]
                self.busy_slot_pins += bool(slot["busy"])
            else:
                slot = max(idle or self.slots, key=lambda s: _common(s["tokens"], tokens))
            slot["busy"] = True
            cached = _common(slot["tokens"], tokens)
            slot["tokens"] = list(tokens)
            self.requests += 1
            return slot, cached


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):
        parts += [p for p in prompt if isinstance(p, str)]
    return "\n".join(parts)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine

    def log_message(self, fmt: str, *args: Any) -> None:  # one line per request on stdout, like the engine
        print(f"srv  {self.command} {self.path} {fmt % args}", flush=True)

    # ----- helpers ---------------------------------------------------------------------------
    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"code": status, "message": message, "type": "server_error"}})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}

    def _loading(self) -> bool:
        if time.monotonic() < self.engine.ready_at:
            self._error(503, "Loading model")
            return True
        return False

    # ----- routes ------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = urlsplit(self.path).path
        if path == "/health":
            if not self._loading():
                self._json(200, {"status": "ok"})
        elif path == "/props":
            self._json(200, {"default_generation_settings": {"n_ctx": self.engine.per_request_ctx()},
                             "total_slots": len(self.engine.slots), "model_alias": self.engine.alias})
        elif path == "/slots":
            self._json(200, [{"id": s["id"], "n_ctx": self.engine.ctx, "is_processing": s["busy"],
                              "n_prompt_tokens": len(s["tokens"])} for s in self.engine.slots])
        elif path == "/metrics":
            text = (f"llamacpp:requests_processing 0\nllamacpp:n_decode_total {self.engine.requests}\n"
                    f"standin:busy_slot_pins {self.engine.busy_slot_pins}\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._error(404, "File Not Found")

    def do_POST(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        body = self._body()
        if self._loading():
            return
        if url.path.startswith("/slots/"):
            self._slot_action(int(url.path.rsplit("/", 1)[1]), parse_qs(url.query).get("action", [""])[0], body)
        elif url.path == "/tokenize":
            self._json(200, {"tokens": list(range(len(str(body.get("content", "")).split())))})
        elif url.path == "/v1/embeddings":
            inputs = body.get("input")
            inputs = inputs if isinstance(inputs, list) else [inputs]
            self._json(200, {"object": "list", "model": self.engine.alias, "data": [
                {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))],
                "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}})
        elif url.path in ("/v1/chat/completions", "/v1/completions"):
            self._generate(url.path, body)
        else:
            self._error(404, "File Not Found")

    def _slot_action(self, slot_id: int, action: str, body: dict[str, Any]) -> None:
        engine = self.engine
        if not 0 <= slot_id < len(engine.slots):
            self._error(400, "Invalid slot ID")
            return
        slot = engine.slots[slot_id]
        if action == "erase":
            n = len(slot["tokens"])
            slot["tokens"] = []
            self._json(200, {"id_slot": slot_id, "n_erased": n})
            return
        name = str(body.get("filename") or "")
        if engine.slot_dir is None or not name or "/" in name or ".." in name:
            self._error(400, "Invalid filename")
            return
        path = engine.slot_dir / name
        if action == "save":
            path.write_text(json.dumps(slot["tokens"]))
            self._json(200, {"id_slot": slot_id, "filename": name, "n_saved": len(slot["tokens"]),
                             "n_written": path.stat().st_size})
        elif action == "restore":
            if not path.is_file():
                self._error(400, "failed to restore slot state: file not found")
                return
            slot["tokens"] = json.loads(path.read_text())
            self._json(200, {"id_slot": slot_id, "filename": name, "n_restored": len(slot["tokens"]),
                             "n_read": path.stat().st_size})
        else:
            self._error(400, "Invalid action")

    def _generate(self, path: str, body: dict[str, Any]) -> None:
        text = _prompt_text(body)
        command = COMMAND.search(text)
        kind, value = (command.group(1), command.group(2)) if command else (None, None)
        if kind == "crash":
            os._exit(3)
        if kind == "fail":
            self._error(int(float(value or 500)), "the stand-in was told to fail")
            return
        tokens = text.split()
        if len(tokens) > self.engine.per_request_ctx():
            self._error(400, f"the request exceeds the available context size ({self.engine.per_request_ctx()} "
                        "tokens), try increasing it")
            return
        wanted = body.get("id_slot")
        slot, cached = self.engine.take_slot(tokens, wanted if isinstance(wanted, int) else None)
        try:
            if kind == "hang":
                while True:
                    time.sleep(3600)
            n = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict", 8)))
            n = n if isinstance(n, int) and n >= 0 else 8
            delay = float(value) if kind == "slow" and value else 0.0
            started = time.perf_counter()
            timings = {"cache_n": cached, "prompt_n": len(tokens) - cached, "prompt_ms": 1.0,
                       "prompt_per_token_ms": 0.1, "prompt_per_second": 1000.0, "predicted_n": n,
                       "predicted_ms": 1.0, "predicted_per_token_ms": 0.1, "predicted_per_second": 1000.0}
            chat = path == "/v1/chat/completions"
            if body.get("stream"):
                self._stream(n, delay, chat, timings, body, len(tokens), slot)
            else:
                for _ in range(n):
                    time.sleep(delay)
                words = " ".join(f"tok{i}" for i in range(n))
                timings["predicted_ms"] = (time.perf_counter() - started) * 1000
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if n else "stop"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": words}
                else:
                    choice["text"] = words
                # llama-server frees the slot as it queues the final result, and handles a request that
                # comes after the answer only once that is done: so the slot is idle before the answer leaves
                slot["busy"] = False
                self._json(200, {"id": "chatcmpl-standin", "object": "chat.completion" if chat else "text_completion",
                                 "created": int(time.time()), "model": self.engine.alias, "choices": [choice],
                                 "usage": {"prompt_tokens": len(tokens), "completion_tokens": n,
                                           "total_tokens": len(tokens) + n,
                                           "prompt_tokens_details": {"cached_tokens": cached}},
                                 "timings": timings})
        finally:  # a request that failed or hung up midway frees its slot here
            slot["busy"] = False

    def _stream(self, n: int, delay: float, chat: bool, timings: dict[str, Any], body: dict[str, Any],
                prompt: int, slot: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict[str, Any], **extra: Any) -> None:
            payload = {"id": "chatcmpl-standin", "object": obj, "created": int(time.time()),
                       "model": self.engine.alias, "choices": [choice] if choice else [], **extra}
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        for i in range(n):
            time.sleep(delay)
            piece = f"tok{i}" if i == 0 else f" tok{i}"
            event({"index": 0, "finish_reason": None,
                   **({"delta": {"content": piece}} if chat else {"text": piece})})
        last = {"index": 0, "finish_reason": "length" if n else "stop", **({"delta": {}} if chat else {"text": ""})}
        slot["busy"] = False
        event(last, timings=timings)
        if (body.get("stream_options") or {}).get("include_usage"):
            event({}, usage={"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
                  timings=timings)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="standin")
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--parallel", "-np", type=int, default=4)
    parser.add_argument("--slot-save-path", default="")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--exit-seconds", type=float, default=0.0)
    args, _ = parser.parse_known_args(argv)  # the rest of llama-server's flags are accepted and ignored
    if args.exit_seconds > 0:
        signal.signal(signal.SIGTERM, lambda *_: threading.Timer(args.exit_seconds, os._exit, (0,)).start())
    Handler.engine = Engine(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"main: server is listening on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
