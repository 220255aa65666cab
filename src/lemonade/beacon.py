"""UDP discovery beacons: how a server says where it is, and how `lemonade scan` hears it.

The protocol is Lemonade's (guide-cli.md, "Options for scan"): every `INTERVAL_S` seconds a server
with `broadcast` on sends one UDP datagram to port 13305, a JSON object
`{"service": "lemonade", "hostname": "<machine name>", "url": "http://<address>:<port>/api/v1/"}`,
to the broadcast address of each private LAN interface it listens on (so Lemonade apps on the LAN
find it) and to 127.0.0.1 (so a CLI on the same machine finds a server on another port). Listeners
keep the beacons that carry `service`, `hostname` and `url`, one per URL.

Only addresses a client can reach are announced: a server listening on loopback sends the loopback
beacon alone, one bound to a LAN address announces that address, one on all interfaces announces
each private interface. `LEMONADE_BEACON_PORT` moves the UDP port (for tests and isolated setups);
the sender and every listener must agree on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lemonade.config import Config

log = logging.getLogger("lemonade.server")

DEFAULT_PORT = 13305  # a UDP port: the same number as the HTTP default, so no client has to search for it
INTERVAL_S = 2.0
SERVICE = "lemonade"
ANY_HOSTS = ("0.0.0.0", "::", "")
MAX_DATAGRAM = 1024


def beacon_port() -> int:
    raw = os.environ.get("LEMONADE_BEACON_PORT", "").strip()
    return int(raw) if raw.isdigit() and 0 < int(raw) < 65536 else DEFAULT_PORT


@dataclass(frozen=True)
class Beacon:
    hostname: str
    url: str
    sender: str  # the IP address the datagram came from

    @property
    def base_url(self) -> str:
        """The server's origin, as the CLI's `--host`/`LEMONADE_BASE_URL` take it."""
        url = self.url.rstrip("/")
        for suffix in ("/api/v1", "/api/v0", "/v1"):
            url = url.removesuffix(suffix)
        return url


def encode(hostname: str, url: str) -> bytes:
    return json.dumps({"service": SERVICE, "hostname": hostname, "url": url}).encode()


def decode(data: bytes, sender: str) -> Beacon | None:
    """A beacon, or None for any datagram that is not one (other programs may share the port)."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) and obj.get(k) for k in
                                            ("service", "hostname", "url")):
        return None
    return Beacon(obj["hostname"], obj["url"], sender)


def _is_lan(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return addr.version == 4 and addr.is_private and not addr.is_loopback


def lan_interfaces() -> list[tuple[str, str]]:
    """(address, broadcast address) of each up IPv4 interface with a private, non-loopback address."""
    import psutil

    out: list[tuple[str, str]] = []
    with contextlib.suppress(OSError):
        stats = psutil.net_if_stats()
        for name, addrs in psutil.net_if_addrs().items():
            if name in stats and not stats[name].isup:
                continue
            for a in addrs:
                if a.family != socket.AF_INET or not _is_lan(a.address):
                    continue
                bcast = a.broadcast
                if not bcast and a.netmask:
                    bcast = str(ipaddress.IPv4Network(f"{a.address}/{a.netmask}", strict=False).broadcast_address)
                out.append((a.address, bcast or "255.255.255.255"))
    return out


def _url(ip: str, port: int) -> str:
    return f"http://{ip}:{port}/api/v1/"


def destinations(host: str, port: int) -> list[tuple[str, str]]:
    """(where to send, the URL announced) for a server listening on `host`:`port`."""
    if host == "localhost" or (host not in ANY_HOSTS and _is_ip(host) and ipaddress.ip_address(host).is_loopback):
        return [("127.0.0.1", _url("127.0.0.1", port))]
    out = [(bcast, _url(ip, port)) for ip, bcast in lan_interfaces() if host in ANY_HOSTS or host == ip]
    if host in ANY_HOSTS:
        out.append(("127.0.0.1", _url("127.0.0.1", port)))
    elif out:  # one LAN address: a CLI on this machine reaches the server there too
        out.append(("127.0.0.1", out[0][1]))
    return out


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class BeaconSender:
    """The server's beacon loop, on the server's event loop. It sends while `broadcast` is on and
    sleeps on an event otherwise, so an idle server with broadcasting off never wakes for it;
    `config set broadcast=...` takes effect at once."""

    def __init__(self, config: Config, host: str, port: int) -> None:
        self.config = config
        self.host, self.port = host, port
        self.hostname = socket.gethostname() or "UnknownHost"
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._announced: list[tuple[str, str]] | None = None
        config.on_change(self._config_changed)

    def _config_changed(self, changed: dict[str, Any]) -> None:
        if "broadcast" in changed:
            self._loop.call_soon_threadsafe(self._changed.set)

    def enabled(self) -> bool:
        return bool(self.config.get("broadcast"))

    async def run(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setblocking(False)
        port = beacon_port()
        try:
            while True:
                if self.enabled():
                    self._send(sock, port)
                    timeout: float | None = INTERVAL_S
                else:
                    if self._announced is not None:
                        log.info("Discovery beacons off (broadcast=false)")
                    self._announced, timeout = None, None
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout)
        finally:
            sock.close()

    def _send(self, sock: socket.socket, port: int) -> None:
        targets = destinations(self.host, self.port)
        if targets != self._announced:  # logged when it starts and when the interfaces change
            self._announced = targets
            where = ", ".join(f"{url} to {dest}" for dest, url in targets) or "nothing (no private address to announce)"
            log.info("Discovery beacons on UDP port %d every %.0f s: %s", port, INTERVAL_S, where)
        for dest, url in targets:
            try:
                sock.sendto(encode(self.hostname, url), (dest, port))
            except OSError as exc:  # an interface going down must not stop the others
                log.debug("Beacon to %s:%d failed: %s", dest, port, exc)


def listen(duration: float, port: int | None = None, loopback_only: bool = False) -> Iterator[Beacon]:
    """Beacons heard on the UDP port within `duration` seconds, each URL once. OSError when the
    port cannot be bound."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside other listeners on the machine
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.bind(("0.0.0.0", port or beacon_port()))
        seen: set[str] = set()
        deadline = time.monotonic() + duration
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(min(left, 1.0))
            try:
                data, (sender, _) = sock.recvfrom(MAX_DATAGRAM)
            except TimeoutError:
                continue
            if loopback_only and not ipaddress.ip_address(sender).is_loopback:
                continue
            beacon = decode(data, sender)
            if beacon is not None and beacon.url not in seen:
                seen.add(beacon.url)
                yield beacon
    finally:
        sock.close()


def discover_local(timeout: float = INTERVAL_S + 0.5) -> Beacon | None:
    """The first beacon a server on this machine sends within `timeout` (one interval and a margin)."""
    with contextlib.suppress(OSError):
        for beacon in listen(timeout, loopback_only=True):
            return beacon
    return None
