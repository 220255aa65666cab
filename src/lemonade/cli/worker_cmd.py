"""`lemonade worker`: run a llama.cpp RPC worker on this host for a Lemonade server elsewhere.

Installs the pinned llama.cpp backend when needed (with the same progress view as `lemonade
backends install`), starts its `ggml-rpc-server` on `--host`/`--port` in the foreground, says what
it serves and how to point a server at it, and stops it cleanly on Ctrl-C or SIGTERM (its process
group gets SIGTERM, then SIGKILL after a grace period). The worker protocol has no authentication:
bind it to a private network address only (docs/scale-out.md).

Over UDP on the same port it answers a server's status query with its devices and the memory it can
give (backends/llamacpp/worker.py), which the server's split of a model's layers is made from; with
`--broadcast` it also announces itself with discovery beacons, for servers whose `rpc_workers` is
"auto" and for `lemonade scan`.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_ERROR, EXIT_USAGE, err, fail, out
from lemonade.cli.progress import ProgressView
from lemonade.util.process_group import signal_group

if TYPE_CHECKING:
    from lemonade.backends.llamacpp.worker import WorkerStatus

DEVICES_TIMEOUT = 5.0  # seconds to wait, once it listens, for its device list to be read
READY_TIMEOUT = 60.0  # seconds for the worker to listen (it enumerates its devices first)
STOP_GRACE = 5.0


def _warn_exposure(host: str) -> None:
    """The RPC protocol lets any client that connects run computations and read/write its memory."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return
    if addr.is_unspecified or addr.is_global:
        what = "every interface" if addr.is_unspecified else "a public address"
        err.print(f"[yellow]Warning:[/yellow] {escape(host)} is {what}. llama.cpp RPC has no authentication or "
                  "encryption: bind the worker to a "
                  "private network address that only your Lemonade server reaches.", highlight=False)


def _listening(host: str, port: int) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pump(proc: subprocess.Popen[str], devices: list[str], listed: threading.Event,
          status: WorkerStatus) -> None:
    """Echo the worker's output to stderr; collect the devices it lists after "Devices:"; tell
    `status` when a client comes and goes.

    `listed` is set once that list has ended (or the output has): the worker listens as soon as it
    has printed it, and we may see the port open before this thread has read those lines."""
    assert proc.stdout is not None
    from lemonade.backends.llamacpp.worker import parse_device

    in_devices = False
    for line in proc.stdout:
        text = line.rstrip()
        err.print(f"[dim]rpc-server | {escape(text)}[/dim]", highlight=False)
        status.seen(text)
        if text.startswith("Devices:"):
            in_devices = True
        elif in_devices and text.startswith("  ") and "MiB" in text:  # "  CPU: <name> (N MiB, M MiB free)"
            devices.append(text.strip())
            device = parse_device(text)
            if device is not None:
                status.devices.append(device)
        elif in_devices:
            in_devices = False
            listed.set()
    listed.set()


def _stop(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        if not signal_group(proc.pid, sig):
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def worker(
    host: Annotated[str, typer.Option("--host", "-H", help="Address to listen on: a private network address of "
                                      "this host that the Lemonade server reaches")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port to listen on")] = 50052,
    threads: Annotated[int | None, typer.Option("--threads", "-t", min=1, help="Threads for the CPU device "
                                                "(default: the worker's own choice)")] = None,
    device: Annotated[str | None, typer.Option("--device", "-d", help="Comma-separated llama.cpp devices to "
                                               "expose (default: every GPU, else the CPU)")] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Keep received tensors in a local file cache "
                                        "($LLAMA_CACHE/rpc), so the next load of the same model sends less")] = False,
    backend: Annotated[str | None, typer.Option("--backend", help="llama.cpp backend whose worker to run (cpu, "
                                                "vulkan, cuda, ...; default: the best for this machine)")] = None,
    broadcast: Annotated[bool, typer.Option("--broadcast/--no-broadcast", help="Announce this worker with "
                                            "discovery beacons (UDP port 13305, every 2 s), for servers whose "
                                            "rpc_workers is \"auto\" and for `lemonade scan`")] = False,
) -> None:
    """Serve this host's CPU/GPUs to a Lemonade server as a llama.cpp RPC worker (until Ctrl-C)."""
    from lemonade.backends.base import _die_with_parent as die_with_parent
    from lemonade.backends.engine import InstallError
    from lemonade.backends.llamacpp.rpc import worker_argv, worker_binary
    from lemonade.backends.llamacpp.settings import split_worker
    from lemonade.backends.llamacpp.worker import Announcer, WorkerStatus
    from lemonade.beacon import beacon_port
    from lemonade.paths import cache_dir

    if not 1 <= port <= 65535:
        raise fail(f"--port must be from 1 to 65535, got {port}", EXIT_USAGE)
    try:
        split_worker(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    except ValueError as exc:
        raise fail(f"--host: {exc}", EXIT_USAGE) from None
    try:
        with ProgressView("Preparing the llama.cpp RPC worker") as view:
            chosen, binary = worker_binary(cache_dir(), backend, view.update)
    except InstallError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise fail("Interrupted; nothing was started.", EXIT_ERROR) from None
    _warn_exposure(host)
    argv = worker_argv(binary, host, port, threads, cache, device)
    stdbuf = shutil.which("stdbuf")
    line_buffered = [stdbuf, "-oL", "-eL"] if stdbuf else []  # it uses printf
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc = subprocess.Popen([*line_buffered, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                            preexec_fn=die_with_parent)  # a SIGKILLed `lemonade worker` leaves no orphan
    devices: list[str] = []
    listed = threading.Event()
    status = WorkerStatus(socket.gethostname() or "UnknownHost", chosen, [], cache)
    pump = threading.Thread(target=_pump, args=(proc, devices, listed, status), name="rpc-worker-output",
                            daemon=True)
    pump.start()
    announcer: Announcer | None = None
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not _listening(host, port):
            if proc.poll() is not None or stop.is_set() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if proc.poll() is not None:
            pump.join(2.0)
            raise fail(f"ggml-rpc-server exited with code {proc.returncode} before listening on {host}:{port} "
                       "(its output is above; is the port in use?)")
        if not stop.is_set() and not _listening(host, port):
            raise fail(f"ggml-rpc-server did not listen on {host}:{port} within {READY_TIMEOUT:.0f} s")
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not stop.is_set():
            listed.wait(DEVICES_TIMEOUT)
            out.print(f"llama.cpp RPC worker (llamacpp:{escape(chosen)}, pid {proc.pid}) serving on "
                      f"[bold]{escape(address)}[/bold]", highlight=False)
            for dev in devices:
                out.print(f"  device {escape(dev)}", highlight=False)
            status.serving(proc.pid)
            announcer = Announcer(status, host, port, broadcast, beacon_port())
            announcer.start()
            out.print("Use it from a Lemonade server: lemonade config set "
                      f"llamacpp.rpc_workers={escape(json.dumps([address]))}  (Ctrl-C stops the worker)",
                      highlight=False)
            if broadcast:
                out.print(f"Announcing it on UDP port {beacon_port()} every 2 s: servers with "
                          "llamacpp.rpc_workers=auto on this network use it", highlight=False)
        while not stop.is_set() and proc.poll() is None:
            stop.wait(0.2)
        if proc.poll() is not None and not stop.is_set():
            raise fail(f"ggml-rpc-server exited with code {proc.returncode}")
        out.print(f"Stopping the RPC worker (pid {proc.pid})", highlight=False)
    finally:
        if announcer is not None:
            announcer.stop()
        _stop(proc)
        pump.join(2.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
