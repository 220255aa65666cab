"""TCP keep-alive on the server's accepted connections.

Why: a connection that carries no byte for a while (a long prompt read before the first token, a
kept-alive connection between two turns of a chat, a Realtime WebSocket between utterances) can be
dropped without notice by stateful firewalls, NAT gateways and routers on the way; keep-alive probes
keep their entry fresh, and a peer that vanished (a laptop closed mid-request) is noticed in about
30 s instead of hours. The values are Lemonade's (upstream 72d3bf879): the first probe after 15 s
of silence, then every 5 s, and 3 unanswered probes end the connection. A proxy's idle timeout
counts bytes, not probes: streams send SSE keep-alives for that (runtime/keepalive.py).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

IDLE_S = 15
INTERVAL_S = 5
PROBES = 3
# Our own connections to a remote engine (a peer server, a cloud API): a host that vanished mid-answer
# (no reset ever comes) is noticed after about 5 + 3 x 2 seconds of silence, so no request hangs on it.
REMOTE = (5, 2, 3)  # idle, interval, probes
# Linux and Windows call the idle time TCP_KEEPIDLE; macOS calls it TCP_KEEPALIVE.
_IDLE_OPTION = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)


def keep_alive(sock: Any, idle: int = IDLE_S, interval: int = INTERVAL_S, probes: int = PROBES) -> None:
    """Turn keep-alive probes on for a socket (a `socket.socket`, or the socket-like object an event
    loop's transport gives). An option the platform lacks, or a socket that is not TCP (a Unix
    socket), is left as it is."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    if _IDLE_OPTION is not None:
        options.append((socket.IPPROTO_TCP, _IDLE_OPTION, idle))
    for name, value in (("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", probes)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)
