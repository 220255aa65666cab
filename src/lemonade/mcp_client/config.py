"""What an MCP server entry says, checked, and how the entries are stored.

An entry is upstream Lemonade's `McpServerConfig`: `id` (made from `name` or the command when left
out), `name`, `transport` (`stdio`, the only one), `command`, `args`, `env`, `working_dir`,
`enabled`, `timeout_ms` (1000 to 300000, default 30000; `workingDir`/`timeoutMs` are accepted too).
`env` values must be references to the server's own environment, `${VARIABLE}`, resolved when the
process starts: a secret is never written to disk. The file is `{"version": 1, "servers": [...]}`,
written atomically and readable by its owner only; an entry that does not parse is skipped with a
log line and left for the admin to fix.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemonade.util.atomic import atomic_write_json, read_json

log = logging.getLogger("lemonade.mcp_client")
CONFIG_FILE = "mcp_servers.json"
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS, DEFAULT_TIMEOUT_MS = 1000, 300000, 30000
ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,96}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_REF_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
CHAT_NAME_MAX = 64  # OpenAI's limit on a function name


class McpConfigError(ValueError):
    """An entry that cannot be stored; the message names the field."""


@dataclass(frozen=True)
class ServerConfig:
    id: str
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # NAME -> "${VARIABLE}"
    working_dir: str = ""
    enabled: bool = True
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    transport: str = "stdio"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "transport": self.transport, "command": self.command,
                "args": list(self.args), "env": dict(self.env), "working_dir": self.working_dir,
                "enabled": self.enabled, "timeout_ms": self.timeout_ms}

    def resolved_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`env` with each reference replaced by the server's environment variable it names."""
        out = {}
        for key, ref in self.env.items():
            match = ENV_REF_RE.match(ref)
            variable = match.group(1) if match else ref
            if variable not in environ:
                raise McpConfigError(f"MCP server '{self.id}': environment variable {variable} (for env '{key}') is "
                                     "not set in the server's environment")
            out[key] = environ[variable]
        return out


def _string(value: Mapping[str, Any], *names: str, default: str = "") -> str:
    present = [n for n in names if n in value]
    if len(present) > 1:
        raise McpConfigError(f"Use only one of {' or '.join(repr(n) for n in names)}")
    if not present:
        return default
    raw = value[present[0]]
    if not isinstance(raw, str):
        raise McpConfigError(f"'{present[0]}' must be a string")
    if CONTROL_RE.search(raw):
        raise McpConfigError(f"'{present[0]}' must not contain control characters")
    return raw.strip()


def _timeout(value: Mapping[str, Any]) -> int:
    present = [n for n in ("timeout_ms", "timeoutMs") if n in value]
    if len(present) > 1:
        raise McpConfigError("Use only one of 'timeout_ms' or 'timeoutMs'")
    if not present:
        return DEFAULT_TIMEOUT_MS
    raw = value[present[0]]
    if isinstance(raw, bool) or not isinstance(raw, int) or not MIN_TIMEOUT_MS <= raw <= MAX_TIMEOUT_MS:
        raise McpConfigError(f"'{present[0]}' must be an integer from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS} "
                             "(milliseconds)")
    return raw


def check_timeout(value: Mapping[str, Any], default: int) -> int:
    """A request's own `timeout_ms` (`tools/call`), checked like an entry's; `default` when it has none."""
    return _timeout(value) if any(n in value for n in ("timeout_ms", "timeoutMs")) else default


def suggested_id(seed: str) -> str:
    """An id made from a name or command: lower case, runs of other characters as one dash."""
    cleaned = re.sub(r"[^a-z0-9_.]+", "-", seed.rsplit("/", 1)[-1].lower()).strip("-")
    return (cleaned or "mcp-server")[:64]


def parse(value: Any, *, taken: Mapping[str, Any] | None = None) -> ServerConfig:
    """An entry as a client sends it (or as stored). Without an `id` (`taken` given: the ids in use),
    one is made from the name or command, numbered past those in use."""
    if not isinstance(value, Mapping):
        raise McpConfigError("An MCP server entry must be a JSON object")
    transport = _string(value, "transport", default="stdio")
    if transport != "stdio":
        raise McpConfigError(f"'transport' must be 'stdio' (this server connects to MCP servers it starts itself), "
                             f"not '{transport}'")
    command = _string(value, "command")
    if not command:
        raise McpConfigError("'command' is required: the program that runs the MCP server (e.g. 'npx' or a path)")
    name = _string(value, "name")
    server_id = _string(value, "id")
    if not server_id:
        if taken is None:
            raise McpConfigError("'id' is required")
        base = suggested_id(name or command)
        server_id, n = base, 2
        while server_id in taken:
            server_id, n = f"{base}-{n}", n + 1
    if not ID_RE.match(server_id):
        raise McpConfigError(f"'id' must be 1 to 96 letters, digits, '_', '.' or '-' (got {server_id!r})")
    args = value.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and "\x00" not in a for a in args):
        raise McpConfigError("'args' must be an array of strings")
    env = value.get("env", {})
    if not isinstance(env, Mapping):
        raise McpConfigError("'env' must be an object of NAME: \"${VARIABLE}\" references")
    for key, ref in env.items():
        if not ENV_NAME_RE.match(str(key)):
            raise McpConfigError(f"'env' has an invalid variable name: {key!r}")
        if not isinstance(ref, str) or not ENV_REF_RE.match(ref):
            raise McpConfigError(f"'env.{key}' must be a reference such as \"${{{key}}}\" to a variable of the "
                                 "server's environment; values themselves are not stored")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise McpConfigError("'enabled' must be true or false")
    return ServerConfig(id=server_id, name=name or server_id, command=command, args=tuple(args), env=dict(env),
                        working_dir=_string(value, "working_dir", "workingDir"), enabled=enabled,
                        timeout_ms=_timeout(value))


def chat_tool_name(server_id: str, tool: str) -> str:
    """The name an LLM calls an MCP tool by: `mcp_<server>__<tool>`, as upstream names it. Characters
    a function name cannot hold become `_`; when that loses anything (or `__` could be misread) a hash
    of the exact pair is added, and the name is kept to 64 characters."""
    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", text).strip("_") or "tool"

    server, name = clean(server_id), clean(tool)
    suffix = "_" + hashlib.sha256(f"{server_id}\n{tool}".encode()).hexdigest()[:16]
    out = f"mcp_{server}__{name}"
    if server != server_id or name != tool or "__" in server or "__" in name:
        out += suffix
    if len(out) > CHAT_NAME_MAX:
        out = out[: CHAT_NAME_MAX - len(suffix)].rstrip("_-") + suffix
    return out


def load(path: Path) -> dict[str, ServerConfig]:
    try:
        document = read_json(path, {})
    except (OSError, ValueError) as exc:
        log.error("Cannot read %s (%s); no MCP server is configured until it is fixed", path, exc)
        return {}
    servers = document.get("servers", []) if isinstance(document, dict) else None
    if not isinstance(servers, list):
        log.error("%s: 'servers' must be an array; no MCP server is configured until it is fixed", path)
        return {}
    out: dict[str, ServerConfig] = {}
    for entry in servers:
        try:
            config = parse(entry)
        except McpConfigError as exc:
            log.error("Skipping an MCP server entry of %s: %s", path, exc)
            continue
        if config.id in out:
            log.error("Skipping a second MCP server entry with id %s in %s", config.id, path)
            continue
        out[config.id] = config
    return out


def save(path: Path, configs: Mapping[str, ServerConfig]) -> None:
    atomic_write_json(path, {"version": 1, "servers": [c.to_json() for c in configs.values()]})
