"""`lemonade scan`: list the Lemonade servers on the network by their UDP beacons (beacon.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_ERROR, EXIT_USAGE, fail, out


def scan(duration: Annotated[float, typer.Option("--duration", help="Scan duration in seconds", min=0.1)] = 30.0
         ) -> None:
    """Scan for network beacons: Lemonade servers on this machine and the local network announce
    themselves on UDP port 13305 (when their `broadcast` setting is on)."""
    from lemonade.beacon import beacon_port, listen

    port = beacon_port()
    if duration <= 0:
        raise fail("--duration must be more than 0 seconds", EXIT_USAGE)
    out.print(f"Scanning for network beacons on port {port} for {duration:g} seconds...", highlight=False)
    found = []
    try:
        for beacon in listen(duration, port):
            found.append(beacon)
            out.print(f"  Discovered: {escape(beacon.hostname)} at {escape(beacon.url)}", highlight=False)
    except OSError as exc:
        raise fail(f"Could not listen on UDP port {port}: {exc.strerror or exc}", EXIT_ERROR) from None
    except KeyboardInterrupt:
        out.print("Interrupted.")
    out.print(f"\nScan complete. Found {len(found)} beacon(s):", highlight=False)
    if not found:
        out.print("  No beacons discovered.")
    for beacon in found:
        out.print(f"  - {escape(beacon.hostname)} at {escape(beacon.url)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("scan")(scan)
