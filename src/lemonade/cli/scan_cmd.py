"""`lemonade scan`: list the Lemonade servers, and the llama.cpp RPC workers, on the network by their UDP
beacons (beacon.py). Servers are listed as Lemonade lists them; workers (`lemonade worker --broadcast`)
after them, with their devices and free memory."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_ERROR, EXIT_USAGE, fail, out


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _worker_line(beacon: object) -> str:
    from lemonade.beacon import WorkerBeacon

    assert isinstance(beacon, WorkerBeacon)
    devices = ", ".join(f"{d['name']} {_size(d['free_bytes'])} free of {_size(d['total_bytes'])}"
                        for d in beacon.devices)
    state = "busy" if beacon.busy else "idle"
    return (f"{escape(beacon.hostname)} at {escape(beacon.endpoint)}: llamacpp:{escape(beacon.backend or '?')}, "
            f"{escape(devices)}, {state}{', --cache' if beacon.cache else ''}")


def scan(duration: Annotated[float, typer.Option("--duration", help="Scan duration in seconds", min=0.1)] = 30.0
         ) -> None:
    """Scan for network beacons: Lemonade servers on this machine and the local network announce
    themselves on UDP port 13305 (when their `broadcast` setting is on), and so do llama.cpp RPC
    workers started with `lemonade worker --broadcast`."""
    from lemonade.beacon import Beacon, beacon_port, listen_all

    port = beacon_port()
    if duration <= 0:
        raise fail("--duration must be more than 0 seconds", EXIT_USAGE)
    out.print(f"Scanning for network beacons on port {port} for {duration:g} seconds...", highlight=False)
    found: list[Beacon] = []
    workers = []
    try:
        for beacon in listen_all(duration, port):
            if isinstance(beacon, Beacon):
                found.append(beacon)
                out.print(f"  Discovered: {escape(beacon.hostname)} at {escape(beacon.url)}", highlight=False)
            else:
                workers.append(beacon)
                out.print(f"  Discovered RPC worker: {escape(beacon.hostname)} at {escape(beacon.endpoint)}",
                          highlight=False)
    except OSError as exc:
        raise fail(f"Could not listen on UDP port {port}: {exc.strerror or exc}", EXIT_ERROR) from None
    except KeyboardInterrupt:
        out.print("Interrupted.")
    out.print(f"\nScan complete. Found {len(found)} beacon(s):", highlight=False)
    if not found:
        out.print("  No servers discovered." if workers else "  No beacons discovered.")
    for beacon in found:
        out.print(f"  - {escape(beacon.hostname)} at {escape(beacon.url)}", highlight=False)
    if workers:
        out.print(f"Found {len(workers)} llama.cpp RPC worker(s) (rpc_workers: \"auto\" uses them):", highlight=False)
        for worker in workers:
            out.print(f"  - {_worker_line(worker)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("scan")(scan)
