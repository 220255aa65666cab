"""llama.cpp's distributed engine: `ggml-rpc-server` workers and `llama-server --rpc`.

When one machine is not enough, llama.cpp spreads a model's layers over the devices of several:
each worker host runs `ggml-rpc-server` (`lemonade worker`), which exposes its CPU or GPUs over
TCP, and the main host's `llama-server --rpc host:port,...` places layers on them in proportion to
their free memory (docs/scale-out.md). This module is everything Lemonade knows about that:

- the worker list, from the server-wide `llamacpp.rpc_workers` or a model's `rpc_workers` option,
  checked entry by entry (`host:port`, `[v6addr]:port`; llamacpp_settings.py, which config
  validation uses too) so a bad one is refused with a 400 naming it;
- reachability: a TCP connect with a short timeout, before a load (an unreachable worker would make
  `llama-server` fail or hang while loading) and for `/v1/health` and `/v1/system-info`;
- the worker side: the `ggml-rpc-server` command line `lemonade worker` runs.

The RPC protocol has no authentication and no encryption: a worker must listen only on a private
network that the main host reaches (upstream says the same). A worker serves one main host at a
time (its accept loop is serial); a second one waits until the first disconnects.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from lemonade.llamacpp_settings import WorkerSpecError, split_worker, worker_list

PROBE_TIMEOUT = 2.0  # seconds for the check before a load
HEALTH_TIMEOUT = 0.5  # seconds for health and system-info, which must stay quick
HOW_TO_FIX = ("Start `lemonade worker --host <its private address> --port <port>` on each of them, check that "
              "this machine reaches them (firewall, network), or remove them from the rpc_workers option of the "
              "model or the server-wide llamacpp.rpc_workers.")


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
