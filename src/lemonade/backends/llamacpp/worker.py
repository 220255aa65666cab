"""What a `lemonade worker` tells the network: its devices and the memory it can give, now.

A server placing a model's layers on RPC workers needs each worker's free memory, and llama.cpp's own
report is not it: `ggml-rpc-server` lists its devices once, at start, and its CPU device calls all of
the machine's RAM free (ggml-cpu: "free system memory is ill-defined"), cgroup caps and other
programs notwithstanding. So the worker reports for itself:

- a CPU device's free memory is the worker's memory budget (lemonade.system.memory, as the server reads
  its own: the cgroup's limit less what the cgroup holds, `MemAvailable`, RAM; less the same reserve),
  read at each report, so it counts what its rpc-server holds for the model it serves. While no server
  is connected, what the rpc-server holds above its size at start counts as free too: it frees a
  client's buffers when the client leaves, but the C allocator keeps the memory for its next
  allocations instead of giving it back, so the process stays as large as the last model made it and
  the next model's layers go there;
- a GPU device's is what `ggml-rpc-server` printed at start;
- `busy`: it serves a llama-server now (its rpc-server says when a client comes and goes).

Two ways out, one payload (beacon.WorkerBeacon): the answer to a status query a server sends to the
worker's RPC port over UDP (always; it tells nothing the RPC port does not), and, with `--broadcast`,
a beacon every INTERVAL_S on the discovery port, for servers whose `rpc_workers` is "auto" and for
`lemonade scan`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
from typing import Any

from lemonade.beacon import (
    INTERVAL_S,
    MAX_DATAGRAM,
    WorkerBeacon,
    encode_worker,
    is_status_query,
    send_datagram,
    worker_destinations,
)
from lemonade.system.memory import read_budget

log = logging.getLogger("lemonade.worker")
MiB = 1 << 20
# "  CPU: AMD EPYC (24105 MiB, 24105 MiB free)", as ggml-rpc-server lists its devices
DEVICE_LINE = re.compile(r"^\s*(?P<name>[^:\s]+): (?P<description>.*) "
                         r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
ACCEPTED, CLOSED = "Accepted client connection", "Client connection closed"


def parse_device(line: str) -> dict[str, Any] | None:
    """One device of ggml-rpc-server's start-up list, or None for any other line."""
    m = DEVICE_LINE.match(line)
    if not m:
        return None
    return {"name": m["name"], "description": m["description"].strip(), "total_bytes": int(m["total"]) * MiB,
            "free_bytes": int(m["free"]) * MiB}


def _resident(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def cpu_free_bytes() -> int:
    """What this host can give a CPU device now: the memory budget the server would admit loads against."""
    return read_budget().admissible_bytes


class WorkerStatus:
    """The worker's devices, as its rpc-server listed them, and whether a llama-server is connected."""

    def __init__(self, hostname: str, backend: str, devices: list[dict[str, Any]], cache: bool) -> None:
        self.hostname = hostname
        self.backend = backend
        self.devices = devices
        self.cache = cache
        self.busy = False
        self.server_pid: int | None = None  # its rpc-server, and what that held once it listened
        self.idle_bytes = 0

    def serving(self, pid: int) -> None:
        """The rpc-server listens: remember its size at rest."""
        self.server_pid = pid
        self.idle_bytes = _resident(pid)

    def _kept_bytes(self) -> int:
        """What an idle rpc-server holds above its size at rest (freed buffers the allocator kept)."""
        if self.busy or self.server_pid is None:
            return 0
        return max(0, _resident(self.server_pid) - self.idle_bytes)

    def seen(self, line: str) -> None:
        """Follow the rpc-server's output: a client comes, a client goes."""
        if ACCEPTED in line:
            self.busy = True
        elif CLOSED in line:
            self.busy = False

    def beacon(self, endpoint: str) -> WorkerBeacon:
        devices = []
        for dev in self.devices:
            free = dev["free_bytes"]
            if dev["name"].upper().startswith("CPU"):
                free = min(free, cpu_free_bytes() + self._kept_bytes())
            devices.append({**dev, "free_bytes": max(0, free)})
        return WorkerBeacon(self.hostname, endpoint, "", self.backend, tuple(devices), self.busy, self.cache)


class Announcer:
    """The worker's UDP side: status answers on its RPC port, and beacons when `broadcast` is on."""

    def __init__(self, status: WorkerStatus, host: str, port: int, broadcast: bool, beacon_port: int) -> None:
        self.status = status
        self.host, self.port = host, port
        self.endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.broadcast = broadcast
        self.beacon_port = beacon_port
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        answer = socket.socket(family, socket.SOCK_DGRAM)
        try:
            answer.bind((self.host, self.port))
        except OSError as exc:  # the worker still serves; servers then split by llama.cpp's own figures
            answer.close()
            log.warning("Cannot answer status queries on UDP %s: %s", self.endpoint, exc.strerror or exc)
        else:
            self._socks.append(answer)
            threading.Thread(target=self._answer, args=(answer,), name="rpc-worker-status", daemon=True).start()
        if self.broadcast and family == socket.AF_INET:
            threading.Thread(target=self._announce, name="rpc-worker-beacons", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _answer(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, sender = sock.recvfrom(MAX_DATAGRAM)
            except OSError:
                return
            if is_status_query(data):
                with contextlib.suppress(OSError):
                    sock.sendto(encode_worker(self.status.beacon(self.endpoint)), sender)

    def _announce(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            announced: list[tuple[str, str]] | None = None
            while not self._stop.is_set():
                targets = worker_destinations(self.host, self.port)
                if targets != announced:
                    announced = targets
                    log.info("Worker beacons on UDP port %d every %.0f s: %s", self.beacon_port, INTERVAL_S,
                             ", ".join(f"{e} to {d}" for d, e in targets) or "nothing (no private address)")
                for dest, endpoint in targets:
                    try:
                        send_datagram(sock, encode_worker(self.status.beacon(endpoint)), dest, self.beacon_port)
                    except OSError as exc:  # an interface going down must not stop the others
                        log.debug("Worker beacon to %s:%d failed: %s", dest, self.beacon_port, exc)
                self._stop.wait(INTERVAL_S)
