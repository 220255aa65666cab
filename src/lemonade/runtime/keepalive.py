"""Keep-alives on a stream whose engine is still reading the prompt.

Why: llama-server sends nothing between its headers and the first token (only a `:` line after 30 s
of silence), and a long prompt takes seconds to read on a CPU (a 4,000-token prompt for Gemma 3 270M
on 2 cores: 5 to 16 s). A client or proxy with an idle timeout (a client library's read timeout,
nginx's `proxy_read_timeout`, a load balancer) gives up on such a silent connection before the first
token (lemonade#1364). So a Server-Sent Events stream still waiting for its engine after
FIRST_CHUNK_WAIT starts without it, and the proxy sends KEEPALIVE, an SSE comment line every SSE
parser skips, every KEEPALIVE_INTERVAL until the engine's first chunk (runtime/proxy.py). The
translators pass it on in their protocol's terms (an Anthropic stream sends its `ping` event);
Ollama's NDJSON has no line a client would skip, so Ollama streams get none.

The wait before the response starts keeps a fast first token as cheap as before: starting a
response while the engine reads a short prompt takes CPU from it (docs/performance.md, sixth round).
"""

from __future__ import annotations

SSE = "text/event-stream"
KEEPALIVE = b": keep-alive\n\n"
FIRST_CHUNK_WAIT = 1.0  # s without the engine's first chunk before the response starts without it
KEEPALIVE_INTERVAL = 1.0  # s between keep-alives, as Lemonade's (upstream aac4d299f)


def is_comment(chunk: bytes) -> bool:
    """Whether an engine's chunk holds SSE comment lines only (a keep-alive, no event)."""
    return all(line.startswith(b":") for line in chunk.split(b"\n") if line.strip())
