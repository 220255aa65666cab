"""httpx clients that share one certificate store.

Why: httpx loads the certificate store (certifi's bundle, or `SSL_CERT_FILE`) for every client it
makes, about 15 ms of CPU on the event loop each time, even for a client that only ever talks plain
HTTP to an engine on loopback. An engine start made two such clients (its readiness poll, its
`/props` read), one of them on a swap's critical path between the engine's readiness and the
model's first answer. One store, loaded at its first use, serves every client.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _certificates() -> ssl.SSLContext:
    return httpx.create_ssl_context()  # what httpx builds for a client by default, environment included


def async_client(**options: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient(**options)` on the shared certificate store."""
    return httpx.AsyncClient(verify=_certificates(), **options)
