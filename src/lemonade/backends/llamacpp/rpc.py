"""llama.cpp's distributed engine: `ggml-rpc-server` workers and `llama-server --rpc`.

When one machine is not enough, llama.cpp spreads a model's layers over the devices of several:
each worker host runs `ggml-rpc-server` (`lemonade worker`), which exposes its CPU or GPUs over
TCP, and the main host's `llama-server --rpc host:port,...` places layers on them in proportion to
their free memory (docs/scale-out.md). This module is everything Lemonade knows about that:

- the worker list, from the server-wide `llamacpp.rpc_workers` or a model's `rpc_workers` option,
  checked entry by entry (`host:port`, `[v6addr]:port`; backends/llamacpp/settings.py, which config
  validation uses too) so a bad one is refused with a 400 naming it;
- reachability: a TCP connect with a short timeout, before a load (an unreachable worker would make
  `llama-server` fail or hang while loading) and for `/v1/health` and `/v1/system-info`;
- what each worker can hold: the status a `lemonade worker` answers over UDP on its RPC port
  (backends/llamacpp/worker.py: its devices and their free memory), from which `decide` decides where the layers
  go (backends/llamacpp/split.py) and refuses, before anything starts, workers that cannot hold the model;
- `rpc_workers: "auto"`: the workers heard announcing themselves (beacon.WorkerDirectory);
- the worker side: the `ggml-rpc-server` command line `lemonade worker` runs.

The RPC protocol has no authentication and no encryption: a worker must listen only on a private
network that the main host reaches (upstream says the same). A worker serves one main host at a
time (its accept loop is serial); a second one waits until the first disconnects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lemonade.backends.llamacpp.memory import SplitNeed
from lemonade.backends.llamacpp.settings import AUTO_WORKERS, split_worker, worker_setting
from lemonade.backends.llamacpp.split import Device, Placement, largest_context, place, split_refusal
from lemonade.beacon import INTERVAL_S, MAX_DATAGRAM, STATUS_QUERY, WorkerBeacon, WorkerDirectory, decode_worker
from lemonade.errors import APIError

PROBE_TIMEOUT = 2.0  # seconds for the check before a load
HEALTH_TIMEOUT = 0.5  # seconds for health and system-info, which must stay quick
HOW_TO_FIX = ("Start `lemonade worker --host <its private address> --port <port>` on each of them, check that "
              "this machine reaches them (firewall, network), or remove them from the rpc_workers option of the "
              "model or the server-wide llamacpp.rpc_workers.")


STATUS_TIMEOUT = 1.0  # seconds for a worker's answer to a status query (asked twice: UDP may lose one)
# llamacpp_args flags that place layers or tensors themselves: with any of them the user's split stands,
# and Lemonade only checks that the workers answer
USER_SPLIT_FLAGS = frozenset({"-ts", "--tensor-split", "-ot", "--override-tensor", "-sm", "--split-mode", "-ngl",
                              "--gpu-layers", "--n-gpu-layers", "-mg", "--main-gpu", "-nkvo", "--no-kv-offload",
                              "-cmoe", "--cpu-moe", "-ncmoe", "--n-cpu-moe"})


def resolve_workers(value: Any, directory: WorkerDirectory) -> list[str]:
    """The workers a load uses: the list given, or with "auto" the ones heard announcing themselves
    (503 naming what to do when none is)."""
    setting = worker_setting(value or [])
    if setting != AUTO_WORKERS:
        return list(setting)
    heard = [b.endpoint for b in directory.workers()]
    if not heard:
        why = f" ({directory.error})" if directory.error else ""
        raise APIError(503, f"rpc_workers is \"auto\" but no llama.cpp RPC worker announced itself on this network "
                       f"within {INTERVAL_S + 0.5:g} s{why}. Start `lemonade worker --host <its private address> "
                       "--broadcast` on each worker host (the same UDP port as this server's beacons, "
                       "LEMONADE_BEACON_PORT), or name the workers in rpc_workers.", code="rpc_worker_unreachable")
    return heard


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


def query_status(worker: str, timeout: float = STATUS_TIMEOUT) -> WorkerBeacon | None:
    """A `lemonade worker`'s devices and free memory, asked over UDP on its RPC port; None when it does
    not answer (down, not a `lemonade worker`, an older one, or UDP filtered on the way)."""
    host, port = split_worker(worker)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)  # only its answers are read
        except OSError:
            return None
        for _attempt in range(2):
            try:
                sock.send(STATUS_QUERY)
                sock.settimeout(timeout / 2)
                data = sock.recv(MAX_DATAGRAM)
            except OSError:  # a timeout, or the port closed (ICMP port unreachable)
                continue
            beacon = decode_worker(data, str(address[0]))
            if beacon is not None:
                return beacon
    return None


def query_statuses(workers: list[str]) -> dict[str, WorkerBeacon | None]:
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(workers)))) as pool:
        return dict(zip(workers, pool.map(query_status, workers), strict=True))


def user_places_layers(llamacpp_args: str) -> bool:
    try:
        argv = shlex.split(llamacpp_args or "")
    except ValueError:
        return False
    return any(token.partition("=")[0] in USER_SPLIT_FLAGS for token in argv)


def devices_of(statuses: dict[str, WorkerBeacon | None]) -> list[Device] | None:
    """Every worker's devices in order, or None when some worker did not report them."""
    devices: list[Device] = []
    for worker, status in statuses.items():
        if status is None:
            return None
        devices += [Device(worker, str(d["name"]), int(d["free_bytes"])) for d in status.devices]
    return devices


def worker_devices(workers: list[str]) -> list[Device] | None:
    """Every worker's devices with their free memory now, in order; None when some worker does not say
    (not a `lemonade worker`, an older one, or UDP filtered on the way)."""
    return devices_of(query_statuses(workers))


def decide(model: str, need: SplitNeed, devices: list[Device], ctx: int | None = None
           ) -> tuple[SplitNeed, Placement]:
    """Where the layers go: at `ctx`, or for the load's estimate at the largest context the devices hold
    up to the one asked (the returned need's main share then asks no more, so the router sizes the
    context within it). 507 naming each worker's shortfall when they cannot hold the model together."""
    main = need.main
    wanted = ctx or main.ctx or 0
    low = ctx or (main.ctx_min if main.ctx_min is not None else wanted)
    fits = largest_context(need, devices, low, wanted) if wanted else None
    if fits is None:
        raise APIError(507, split_refusal(model, need, devices, low, fixed_ctx=main.ctx_min is None),
                       type="server_error", code="insufficient_memory",
                       extra={"rpc_workers": [{"address": d.worker, "device": d.name, "free_bytes": d.free}
                                              for d in devices]})
    placement = place(need, devices, fits)
    assert placement is not None
    if fits < wanted:
        need = dataclasses.replace(need, main=dataclasses.replace(main, ctx=fits, ctx_min=min(main.ctx_min or fits,
                                                                                              fits)))
    return need, placement


def probe_all_sync(workers: list[str], timeout: float = PROBE_TIMEOUT) -> list[dict[str, Any]]:
    """`probe_all` for threads: every worker at once."""
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(workers)))) as pool:
        return list(pool.map(lambda w: probe_sync(w, timeout), workers))


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
    from lemonade.backends.llamacpp.install import BackendInstaller

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
