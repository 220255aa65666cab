"""llama.cpp's distributed engine: `ggml-rpc-server` workers and `llama-server --rpc`.

When one machine is not enough, llama.cpp spreads a model's layers over the devices of several:
each worker host runs `ggml-rpc-server` (`lemonade worker`), which exposes its CPU or GPUs over
TCP, and the main host's `llama-server --rpc host:port,...` places layers on them in proportion to
their free memory (docs/scale-out.md). This module is everything Lemonade knows about that:

- the worker list, from the server-wide `llamacpp.rpc_workers` or a model's `rpc_workers` option,
  checked entry by entry (`host:port`, `[v6addr]:port`) so a bad one is refused with a 400 naming it;
- reachability: a TCP connect with a short timeout, before a load (an unreachable worker would make
  `llama-server` fail or hang while loading) and for `/v1/health` and `/v1/system-info`;
- the worker side: the `ggml-rpc-server` command line `lemonade worker` runs.

The RPC protocol has no authentication and no encryption: a worker must listen only on a private
network that the main host reaches (upstream says the same). A worker serves one main host at a
time (its accept loop is serial); a second one waits until the first disconnects.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from pathlib import Path
from typing import Any

DEFAULT_PORT = 50052  # upstream's default for ggml-rpc-server
PROBE_TIMEOUT = 2.0  # seconds for the check before a load
HEALTH_TIMEOUT = 0.5  # seconds for health and system-info, which must stay quick
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
HOW_TO_FIX = ("Start `lemonade worker --host <its private address> --port <port>` on each of them, check that "
              "this machine reaches them (firewall, network), or remove them from the rpc_workers option of the "
              "model or the server-wide llamacpp.rpc_workers.")


class WorkerSpecError(ValueError):
    """A worker entry that is not `host:port`; the message names the entry."""


def split_worker(entry: str) -> tuple[str, int]:
    """`host:port` (a host name, an IPv4 address, or `[IPv6]`) -> (host, port); WorkerSpecError
    naming the entry otherwise."""
    text = entry.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})", text) or re.fullmatch(r"([^:\[\]\s]+):(\d{1,5})", text)
    if not m:
        raise WorkerSpecError(f"RPC worker '{entry}' must be host:port (e.g. 10.0.0.2:{DEFAULT_PORT}, or "
                              f"[fd00::2]:{DEFAULT_PORT} for IPv6)")
    host, port = m.group(1), int(m.group(2))
    if not 1 <= port <= 65535:
        raise WorkerSpecError(f"RPC worker '{entry}': port {port} is not from 1 to 65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host):
            raise WorkerSpecError(f"RPC worker '{entry}': '{host}' is neither an IP address nor a host name") from None
    return host, port


def worker_list(value: Any, what: str = "rpc_workers") -> list[str]:
    """A JSON list of `host:port` strings (a comma-separated string too, as env vars give it),
    normalised and without duplicates; WorkerSpecError naming `what` and the bad entry."""
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise WorkerSpecError(f"'{what}' must be a list of host:port strings, got {type(value).__name__}")
    out: list[str] = []
    for entry in value:
        if not isinstance(entry, str):
            raise WorkerSpecError(f"'{what}' entry {entry!r} must be a host:port string")
        try:
            host, port = split_worker(entry)
        except WorkerSpecError as exc:
            raise WorkerSpecError(f"'{what}': {exc}") from None
        name = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if name not in out:
            out.append(name)
    return out


def check_option(value: Any) -> str | None:
    """The `rpc_workers` recipe option's check: an error message naming the bad entry, or None."""
    try:
        worker_list(value)
    except WorkerSpecError as exc:
        return f"Option {exc}"
    return None


def rpc_args(workers: list[str]) -> list[str]:
    """What `llama-server` gets for these workers (nothing without any)."""
    return ["--rpc", ",".join(workers)] if workers else []


# --- reachability ------------------------------------------------------------------------------


def _result(worker: str, started: float, error: str | None) -> dict[str, Any]:
    reachable = error is None
    return {"address": worker, "reachable": reachable,
            "latency_ms": round((time.perf_counter() - started) * 1000, 2) if reachable else None,
            **({"error": error} if error else {})}


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


async def probe(worker: str, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """Can we open a TCP connection to the worker? `{"address", "reachable", "latency_ms"[, "error"]}`;
    latency is the connect time. The connection is closed at once (the worker reads EOF and waits for
    the next client)."""
    host, port = split_worker(worker)
    started = time.perf_counter()
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        return _result(worker, started, _describe(exc, timeout))
    result = _result(worker, started, None)
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (OSError, TimeoutError):
        pass
    return result


async def probe_all(workers: list[str], timeout: float = PROBE_TIMEOUT) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(probe(w, timeout) for w in workers)))


def probe_sync(worker: str, timeout: float = HEALTH_TIMEOUT) -> dict[str, Any]:
    """`probe` for threads (system-info runs in one)."""
    host, port = split_worker(worker)
    started = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        return _result(worker, started, _describe(exc, timeout))
    return _result(worker, started, None)


def unreachable_message(model: str, down: list[dict[str, Any]]) -> str:
    names = ", ".join(f"{d['address']} ({d.get('error', 'unreachable')})" for d in down)
    return (f"Cannot load {model} over llama.cpp RPC: worker{'s' if len(down) > 1 else ''} {names} "
            f"{'are' if len(down) > 1 else 'is'} not reachable. {HOW_TO_FIX}")


# --- the worker side ---------------------------------------------------------------------------


def worker_argv(binary: Path, host: str, port: int, threads: int | None = None, cache: bool = False,
                device: str | None = None) -> list[str]:
    """The `ggml-rpc-server` command line (its own flags: -H, -p, -t, -c, -d)."""
    argv = [str(binary), "--host", host, "--port", str(port)]
    if threads:
        argv += ["--threads", str(threads)]
    if device:
        argv += ["--device", device]
    if cache:
        argv.append("--cache")
    return argv


def worker_binary(cache_dir: Path, backend: str | None = None, progress: Any = None) -> tuple[str, Path]:
    """(backend, path of its `ggml-rpc-server`), installing the pinned llama.cpp backend first when it
    is not installed (the same build `llama-server` comes from, so worker and main host speak the same
    RPC protocol version). `backend`: a llama.cpp backend (default: the best for this machine's
    devices). Raises InstallError with what to do."""
    from lemonade.backends.engine import InstallError
    from lemonade.backends.install import BackendInstaller

    installer = BackendInstaller(cache_dir)
    chosen = backend or installer.default_backend()
    installer.check_request("llamacpp", chosen)
    if chosen != "system" and not installer.is_installed(chosen):
        installer.install("llamacpp", chosen, progress)
    binary = installer.rpc_server_path(chosen)
    if binary is None:
        where = "on PATH" if chosen == "system" else f"in the installed llamacpp:{chosen} backend"
        raise InstallError(f"No ggml-rpc-server (or rpc-server) {where}. Reinstall it with "
                           f"`lemonade backends install llamacpp:{chosen} --force` (this Lemonade builds llama.cpp "
                           "with its RPC backend), or choose another backend with --backend.", code="not_found")
    return chosen, binary
