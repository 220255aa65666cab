"""What the llama.cpp settings accept: RPC worker lists (or "auto"), device names, speculation modes.

llama.cpp's descriptor (descriptor.py beside this) checks `llamacpp.rpc_workers`, `llamacpp.device` and
`llamacpp.speculation` with these, for config validation, and the engine reads the values with the
same functions; they sit below config (tests/test_layers.py), so config needs no engine to check a value.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

DEFAULT_PORT = 50052  # upstream's default for ggml-rpc-server
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_DEVICE_RE = re.compile(r"(none|[A-Za-z][A-Za-z_-]*\d*)(,[A-Za-z][A-Za-z_-]*\d*)*")


def check_device(what: str, value: str) -> str | None:
    """Why `value` is not a llama.cpp device list, or None: device names as `llama-server
    --list-devices` prints them (`Vulkan0`, `CUDA1`, `ROCm0`, `MTL0`; a comma list; `none`), or empty
    for llama-server's own choice. Anything else would only fail when the engine starts."""
    if value and not _DEVICE_RE.fullmatch(value):
        return (f"'{what}' must be llama.cpp device names such as Vulkan0 or CUDA0,CUDA1 (see llama-server "
                f"--list-devices), or empty for the default; got '{value}'")
    return None


# `speculation`: auto (on while it makes the model faster, runtime/speculation.py), on, off
SPECULATION_MODES = ("auto", "on", "off")


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


AUTO_WORKERS = "auto"  # the RPC workers heard announcing themselves on the LAN (`lemonade worker --broadcast`)


def worker_setting(value: Any, what: str = "rpc_workers") -> list[str] | str:
    """An `rpc_workers` value: `"auto"` as it is, else `worker_list`'s checked list."""
    if isinstance(value, str) and value.strip().lower() == AUTO_WORKERS:
        return AUTO_WORKERS
    if isinstance(value, str) and not value.strip():
        return []
    if not isinstance(value, list):
        raise WorkerSpecError(f"'{what}' must be a list of host:port strings, or \"auto\" for the workers heard on "
                              f"the network; got {type(value).__name__} {value!r}")
    return worker_list(value, what)


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


def worker_text(raw: str) -> Any:
    """An `rpc_workers` value as an env var or a flag gives it: JSON, `auto`, or a comma list
    (`LEMONADE_LLAMACPP_RPC_WORKERS=10.0.0.2:50052,10.0.0.3:50052`)."""
    text = raw.strip()
    if text.startswith("["):
        return json.loads(text)
    return text if text.lower() == AUTO_WORKERS else [part.strip() for part in raw.split(",") if part.strip()]
