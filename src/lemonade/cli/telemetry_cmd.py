"""`lemonade telemetry on|off`: turn the server's trace export on or off until it restarts.

The change is made in memory (`POST /internal/set?persist=false`), not written to config.json
(guide-cli.md, "Options for telemetry"); `lemonade config set telemetry.enabled=...` is the lasting
way. Where traces go is the `telemetry.otlp` settings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from lemonade.cli.common import HostOpt, PortOpt, out, require_server


class State(StrEnum):
    on = "on"
    off = "off"


def telemetry(state: Annotated[State, typer.Argument(help="on or off")],
              host: HostOpt = None, port: PortOpt = None) -> None:
    """Enable or disable telemetry tracing on the running server (until it restarts)."""
    c = require_server(host, port)
    enable = state is State.on
    body = c.post("/internal/set", {"telemetry": {"enabled": enable}}, params={"persist": "false"}) or {}
    where = ((body.get("config") or {}).get("telemetry") or {}).get("otlp", {}).get("endpoint")
    out.print(f"Telemetry successfully turned {state.value}." + (f" Traces go to {where}." if enable and where else ""),
              highlight=False)


def register(app: typer.Typer) -> None:
    app.command("telemetry")(telemetry)
