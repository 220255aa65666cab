"""Our server's fixed CPU per request, in-process: the ASGI app driven directly, no sockets.

Why: on a shared machine wall times drift with other load, but the CPU time our code spends on a
request does not much. This drives `create_app` as raw ASGI with the headers an SDK sends, for
requests that run everything of ours up to the engine and stop there: `POST /v1/chat/completions`
and Ollama's `POST /api/chat` for an unknown model (guard, routing, body validation, name
resolution, error response), and `GET /v1/health`. It prints CPU microseconds per request
(`time.process_time`, median of `--repeat` batches). Compare two trees by running it with each on
`PYTHONPATH`. Results: docs/performance.md.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_request_overhead.py [--n 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

CHAT = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 1}).encode()
CASES = (("POST", "/v1/chat/completions", CHAT, 404), ("POST", "/api/chat", CHAT, 404), ("GET", "/v1/health", b"", 200))


def scope(method: str, path: str, body: bytes) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1:13305"), (b"user-agent", b"OpenAI/Python 1.40"), (b"accept", b"*/*"),
               (b"accept-encoding", b"gzip, deflate"), (b"connection", b"keep-alive")]
    if method == "POST":
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 13305)}


async def call(app: Any, method: str, path: str, body: bytes) -> int:
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # no disconnect: the request runs to its end
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope(method, path, body), receive, send)
    return int(sent[0]["status"])


async def measure(app: Any, n: int, repeat: int) -> None:
    for method, path, body, expected in CASES:
        status = await call(app, method, path, body)
        if status != expected:
            raise SystemExit(f"{method} {path} answered {status}, expected {expected}")
        for _ in range(200):
            await call(app, method, path, body)
        batches = []
        for _ in range(repeat):
            start = time.process_time()
            for _ in range(n):
                await call(app, method, path, body)
            batches.append((time.process_time() - start) / n * 1e6)
        print(f"{method:4} {path:24} {statistics.median(batches):6.0f} us CPU per request "
              f"(batches {', '.join(f'{b:.0f}' for b in batches)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="requests per batch")
    parser.add_argument("--repeat", type=int, default=3, help="batches per case")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="lemonade-overhead-")
    os.environ["LEMONADE_CACHE_DIR"] = cache
    logging.disable(logging.WARNING)  # the 404s would log
    from lemonade.server import build

    try:
        _, _, app = build({}, cache=cache)
        asyncio.run(measure(app, args.n, args.repeat))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
