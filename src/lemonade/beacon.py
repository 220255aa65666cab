"""UDP discovery beacons: how a server says where it is, and how `lemonade scan` hears it.

The protocol is Lemonade's (guide-cli.md, "Options for scan"): every `INTERVAL_S` seconds a server
with `broadcast` on sends one UDP datagram to port 13305, a JSON object
`{"service": "lemonade", "hostname": "<machine name>", "url": "http://<address>:<port>/api/v1/"}`,
to the broadcast address of each private LAN interface it listens on (so Lemonade apps on the LAN
find it) and to 127.0.0.1 (so a CLI on the same machine finds a server on another port). Listeners
keep the beacons that carry `service`, `hostname` and `url`, one per URL.

A llama.cpp RPC worker (`lemonade worker --broadcast`) announces itself on the same port with a beacon
of its own kind (`WorkerBeacon`): `{"service": "lemonade-worker", "hostname", "endpoint": "<address>:<port>",
"backend", "devices": [{"name", "description", "total_bytes", "free_bytes"}], "busy", "cache"}`. It carries
no `url` (a worker serves no HTTP), so listeners of server beacons, ours (`listen`) and Lemonade's
apps, pass it by. The same payload answers a status query sent to the worker's RPC port over UDP
(`STATUS_QUERY`), which is how a server learns a worker's devices and free memory before it places
layers on it. Workers send their loopback beacon to 127.255.255.255, the loopback broadcast address,
so every listener on the machine hears it (a unicast datagram reaches only one of several sockets
bound to the port).

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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from lemonade.config import Config

log = logging.getLogger("lemonade.server")

DEFAULT_PORT = 13305  # a UDP port: the same number as the HTTP default, so no client has to search for it
INTERVAL_S = 2.0
SERVICE = "lemonade"
ANY_HOSTS = ("0.0.0.0", "::", "")
MAX_DATAGRAM = 4096  # a worker's beacon lists its devices; a server's is about 100 bytes
WORKER_SERVICE = "lemonade-worker"
WORKER_MAX_DEVICES = 16
LOOPBACK_BROADCAST = "127.255.255.255"
# A status query is padded to this size, so the answer (a few hundred bytes) is no larger than the
# question: a forged source address gains an attacker nothing by it.
STATUS_QUERY_BYTES = 600
STATUS_QUERY = json.dumps({"service": WORKER_SERVICE, "query": "status"}).encode().ljust(STATUS_QUERY_BYTES)


def beacon_port() -> int:
    raw = os.environ.get("LEMONADE_BEACON_PORT", "").strip()
    return int(raw) if raw.isdigit() and 0 < int(raw) < 65536 else DEFAULT_PORT


@dataclass(frozen=True)
class Beacon:
    hostname: str
    url: str
    sender: str  # the IP address the datagram came from
    service: str = SERVICE  # what announced itself ("lemonade": a server)

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
    return Beacon(obj["hostname"], obj["url"], sender, obj["service"])


@dataclass(frozen=True)
class WorkerBeacon:
    """A llama.cpp RPC worker's announcement (or its answer to a status query)."""

    hostname: str
    endpoint: str  # host:port of its ggml-rpc-server, as a server's rpc_workers names it
    sender: str  # the IP address the datagram came from
    backend: str = ""  # the llama.cpp backend it runs (cpu, vulkan, cuda, ...)
    devices: tuple[dict[str, Any], ...] = field(default_factory=tuple)  # name, description, total/free bytes
    busy: bool = False  # serving a llama-server now (it serves one at a time)
    cache: bool = False  # keeps received tensors on its disk (`--cache`)

    @property
    def free_bytes(self) -> int:
        return sum(int(d.get("free_bytes") or 0) for d in self.devices)

    def payload(self) -> dict[str, Any]:
        return {"service": WORKER_SERVICE, "hostname": self.hostname, "endpoint": self.endpoint,
                "backend": self.backend, "devices": list(self.devices), "busy": self.busy, "cache": self.cache}


def encode_worker(beacon: WorkerBeacon) -> bytes:
    return json.dumps(beacon.payload(), separators=(",", ":")).encode()


def _device(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    sizes = {k: item.get(k) for k in ("total_bytes", "free_bytes")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes.values()):
        return None
    return {"name": item["name"][:64], "description": str(item.get("description") or "")[:128], **sizes}


def decode_worker(data: bytes, sender: str) -> WorkerBeacon | None:
    """A worker's beacon, or None for anything else (a server's beacon included)."""
    from lemonade.backends.llamacpp.settings import WorkerSpecError, split_worker

    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("service") != WORKER_SERVICE or "query" in obj:
        return None
    hostname, endpoint, devices = obj.get("hostname"), obj.get("endpoint"), obj.get("devices")
    if not isinstance(hostname, str) or not hostname or not isinstance(endpoint, str) or not isinstance(devices, list):
        return None
    try:
        split_worker(endpoint)
    except WorkerSpecError:
        return None
    parsed = [_device(d) for d in devices[:WORKER_MAX_DEVICES]]
    if not parsed or any(d is None for d in parsed):
        return None
    return WorkerBeacon(hostname[:253], endpoint, sender, str(obj.get("backend") or "")[:32],
                        tuple(d for d in parsed if d is not None), obj.get("busy") is True, obj.get("cache") is True)


def is_status_query(data: bytes) -> bool:
    """A server asking a worker for its status (padded to STATUS_QUERY_BYTES: see there)."""
    if len(data) < STATUS_QUERY_BYTES:
        return False
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and obj.get("service") == WORKER_SERVICE and obj.get("query") == "status"


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
                # an address configured without a broadcast address (`ip addr add` without `brd +`) reports
                # itself as one (glibc's getifaddrs): from there a datagram reaches no other host
                if (not bcast or bcast == a.address) and a.netmask:
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


def worker_destinations(host: str, port: int) -> list[tuple[str, str]]:
    """(where to send, the endpoint announced) for a worker listening on `host`:`port`: each private LAN
    interface it listens on gets its address on its broadcast address, and its machine (the loopback
    broadcast address, so every listener there hears it) the loopback address or its one LAN address."""
    if host == "localhost" or (host not in ANY_HOSTS and _is_ip(host) and ipaddress.ip_address(host).is_loopback):
        return [(LOOPBACK_BROADCAST, f"{'127.0.0.1' if host == 'localhost' else host}:{port}")]
    out = [(bcast, f"{ip}:{port}") for ip, bcast in lan_interfaces() if host in ANY_HOSTS or host == ip]
    local = f"127.0.0.1:{port}" if host in ANY_HOSTS else out[0][1] if out else None
    return out + ([(LOOPBACK_BROADCAST, local)] if local else [])


def send_datagram(sock: socket.socket, data: bytes, dest: str, port: int) -> None:
    """One datagram; to the loopback broadcast address, where a system has none, to 127.0.0.1 instead."""
    try:
        sock.sendto(data, (dest, port))
    except OSError:
        if dest != LOOPBACK_BROADCAST:
            raise
        sock.sendto(data, ("127.0.0.1", port))


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


def listening_socket(port: int | None = None) -> socket.socket:
    """A UDP socket bound to the beacon port, beside other listeners on the machine; OSError when
    the port cannot be bound."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # beside other listeners on the machine
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.bind(("0.0.0.0", port or beacon_port()))
    except OSError:
        sock.close()
        raise
    return sock


def listen_all(duration: float, port: int | None = None, loopback_only: bool = False
               ) -> Iterator[Beacon | WorkerBeacon]:
    """Beacons of servers and of RPC workers heard on the UDP port within `duration` seconds, each
    server URL and worker endpoint once. OSError when the port cannot be bound."""
    sock = listening_socket(port)
    try:
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
            beacon: Beacon | WorkerBeacon | None = decode(data, sender) or decode_worker(data, sender)
            key = beacon.url if isinstance(beacon, Beacon) else beacon.endpoint if beacon is not None else ""
            if beacon is not None and key not in seen:
                seen.add(key)
                yield beacon
    finally:
        sock.close()


def listen(duration: float, port: int | None = None, loopback_only: bool = False) -> Iterator[Beacon]:
    """Beacons of servers heard on the UDP port within `duration` seconds, each URL once. OSError when
    the port cannot be bound."""
    for beacon in listen_all(duration, port, loopback_only):
        if isinstance(beacon, Beacon):
            yield beacon


class WorkerDirectory:
    """The RPC workers heard announcing themselves, for a server whose `rpc_workers` is "auto": a
    listener thread started on first use and kept (beacons leave every INTERVAL_S, so one started late
    has heard every worker after one interval and a margin). Only a beacon sent from the address it
    names, a private or loopback one, is kept: a beacon cannot point the server at another host."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port
        self._heard: dict[str, tuple[float, WorkerBeacon]] = {}
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._error: str | None = None

    def _start(self) -> None:
        with self._lock:
            if self._started_at is not None:
                return
            self._started_at = time.monotonic()
        try:
            sock = listening_socket(self.port)
        except OSError as exc:
            self._error = f"cannot listen on UDP port {self.port or beacon_port()}: {exc.strerror or exc}"
            log.warning("RPC worker discovery: %s", self._error)
            return
        threading.Thread(target=self._run, args=(sock,), name="rpc-worker-beacons", daemon=True).start()
        log.info("Listening for RPC worker beacons on UDP port %d (rpc_workers: auto)", sock.getsockname()[1])

    def _run(self, sock: socket.socket) -> None:
        while True:
            try:
                data, (sender, _) = sock.recvfrom(MAX_DATAGRAM)
            except OSError:
                return
            beacon = decode_worker(data, sender)
            if beacon is None or not _announces_itself(beacon):
                continue
            with self._lock:
                if beacon.endpoint not in self._heard:
                    log.info("Heard RPC worker %s (%s, %s)", beacon.endpoint, beacon.hostname, beacon.backend)
                self._heard[beacon.endpoint] = (time.monotonic(), beacon)

    def workers(self, max_age: float = 3 * INTERVAL_S, wait: bool = True) -> list[WorkerBeacon]:
        """The workers heard within `max_age` seconds, by endpoint. The first call starts listening; with
        `wait`, a call in the first interval after that waits until one interval and a margin have
        passed, so every worker has been heard."""
        self._start()
        assert self._started_at is not None
        left = self._started_at + INTERVAL_S + 0.5 - time.monotonic()
        if wait and left > 0 and self._error is None:
            time.sleep(left)
        now = time.monotonic()
        with self._lock:
            return [b for t, b in sorted(self._heard.values(), key=lambda x: x[1].endpoint) if now - t <= max_age]

    @property
    def error(self) -> str | None:
        return self._error


def _announces_itself(beacon: WorkerBeacon) -> bool:
    from lemonade.backends.llamacpp.settings import split_worker

    host, _ = split_worker(beacon.endpoint)
    if not _is_ip(host) or host != beacon.sender:
        return False
    addr = ipaddress.ip_address(host)
    return addr.is_private or addr.is_loopback


def discover_local(timeout: float = INTERVAL_S + 0.5) -> Beacon | None:
    """The first beacon a server on this machine sends within `timeout` (one interval and a margin)."""
    with contextlib.suppress(OSError):
        for beacon in listen(timeout, loopback_only=True):
            return beacon
    return None


class BeaconListener:
    """The servers a running server hears, in the background (config `peers: "auto"`,
    backends/peer/peers.py): the latest beacon of each server URL and when it came. Only server beacons
    (`service` "lemonade") sent from the address their URL names count: a beacon cannot send the
    server's challenges to another host."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port
        self._heard: dict[str, tuple[Beacon, float]] = {}

    async def run(self) -> None:
        """Listen until cancelled (OSError when the port cannot be bound)."""
        listener = self

        class Heard(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
                beacon = decode(data, str(addr[0]))
                if beacon is not None and beacon.service == SERVICE and urlsplit(beacon.url).hostname == beacon.sender:
                    listener._heard[beacon.base_url] = (beacon, time.monotonic())

        sock = listening_socket(self.port)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(Heard, sock=sock)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            transport.close()

    def recent(self, within: float) -> list[Beacon]:
        """The servers heard in the last `within` seconds, each once, in the order first heard."""
        since = time.monotonic() - within
        return [beacon for beacon, when in self._heard.values() if when >= since]
