"""Ports for processes we start and then talk to (engine servers; test servers in the suite).

Why not simply `bind(("127.0.0.1", 0))`: the OS takes that port from its ephemeral range, the range
every outgoing connection on the machine also draws its local port from. Between handing the port out
and the engine binding it (a second or more while it starts), any client connection may take it, and
the engine then fails with "address already in use". Below the ephemeral range no outgoing connection
is ever given a port, so a port found free there stays free unless another program binds it on purpose.
"""

from __future__ import annotations

import random
import socket
import sys
from collections import deque
from pathlib import Path

_LOWEST = 20000  # below, ports well-known services use
_recent: deque[int] = deque(maxlen=256)  # handed out by this process, perhaps not bound yet


def ephemeral_range() -> tuple[int, int]:
    """The OS's range for outgoing connections (Linux reads it; elsewhere IANA's dynamic range)."""
    if sys.platform.startswith("linux"):
        try:
            low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
            return int(low), int(high)
        except (OSError, ValueError):
            pass
    return 49152, 65535


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing holds now, outside the ephemeral range where possible, and not one
    this process handed out recently."""
    low = ephemeral_range()[0]
    if low - _LOWEST >= 1000:
        for _ in range(64):
            port = random.randrange(_LOWEST, low)
            if port not in _recent and _bindable(port):
                _recent.append(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a machine with an unusual range
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _recent.append(port)
    return port
