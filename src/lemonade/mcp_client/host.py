"""The connections to external MCP servers, through the official `mcp` package's client.

A connection is one task that holds the client open (the `mcp` client's transport lives in anyio
scopes that must close in the task that opened them) until `disconnect`, or until the server's
output ends (its process exited), which the read side of the transport reports here at once: the
connection is then shown as disconnected with what happened, and a call waiting on it fails with a
502 rather than hanging. Nothing connects by itself: `connect` does (and `refresh-tools` and
`tools/call`, as upstream's do), for an `enabled` entry. Tools are listed at connect and on refresh.

Errors are API errors: an unknown id is a 404, a disabled entry a 409, an entry or request that is
not valid a 400 naming the field, and an MCP server that cannot be started, does not speak MCP or
answers a call with an error a 502 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:  # the `mcp` package is imported when a connection opens: the server starts without it
    from mcp import Client, StdioServerParameters

from lemonade import __version__
from lemonade.errors import APIError
from lemonade.mcp_client.config import (
    CONFIG_FILE,
    McpConfigError,
    ServerConfig,
    chat_tool_name,
    check_timeout,
    load,
    parse,
    save,
)

log = logging.getLogger("lemonade.mcp_client")
MAX_TOOL_PAGES = 32  # a tools/list that pages on past this is refused, as upstream's
STOP_SECONDS = 10.0  # the mcp transport's own shutdown is bounded (stdin closed, then TERM, then KILL)
EXITED = "The MCP server closed its connection (its process exited)"


class _Watched:
    """The transport's read stream, telling `ended` when it closes: the server's output ended."""

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self.inner, self.ended = inner, ended

    async def receive(self) -> Any:
        try:
            return await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self.ended.set()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def _watched_stdio(params: StdioServerParameters, ended: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
    from mcp.client.stdio import stdio_client

    async with stdio_client(params) as (read, write):
        yield _Watched(read, ended), write


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True) if model is not None else {}


def _failure(exc: BaseException) -> str:
    """What went wrong, for a message: exception groups (anyio's) are opened to their first cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


class Connection:
    """One registered server and, while connected, its client, its description and its tools."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.tools: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._lock = asyncio.Lock()

    @property
    def timeout(self) -> float:
        return self.config.timeout_ms / 1000

    def snapshot(self) -> dict[str, Any]:
        connected = self.client is not None
        return {**self.config.to_json(), "status": "connected" if connected else "disconnected",
                "connected": connected, "last_error": self.last_error,
                "protocol_version": self.info.get("protocol_version", ""),
                "server_info": self.info.get("server_info", {}), "capabilities": self.info.get("capabilities", {}),
                "tools": list(self.tools)}

    async def connect(self, environ: Mapping[str, str]) -> None:
        async with self._lock:
            if self.client is not None:
                return
            try:
                env = self.config.resolved_env(environ)
            except McpConfigError as exc:
                self.last_error = str(exc)
                raise APIError(400, str(exc), code="mcp_env_missing") from None
            from mcp import StdioServerParameters

            params = StdioServerParameters(command=self.config.command, args=list(self.config.args), env=env,
                                           cwd=self.config.working_dir or None)
            ready: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
            self._stopping, self._wake = False, asyncio.Event()
            self._task = asyncio.create_task(self._hold(params, ready), name=f"mcp:{self.config.id}")
            try:
                failure = await asyncio.wait_for(asyncio.shield(ready), self.timeout)
            except TimeoutError:
                await self._stop()
                failure = TimeoutError(f"no answer to the MCP handshake within {self.timeout:g} s")
                self.last_error = str(failure)
            if failure is not None:
                raise APIError(502, f"MCP server '{self.config.id}' could not be connected: {self.last_error}",
                               code="mcp_server_failed")
            log.info("MCP server %s connected (%s %s): %d tool(s)", self.config.id, self.info.get("server_info", {})
                     .get("name", "?"), self.info.get("protocol_version", ""), len(self.tools))

    async def _hold(self, params: StdioServerParameters, ready: asyncio.Future[BaseException | None]) -> None:
        """The connection's task: open, describe, wait until told to stop or the server goes away."""
        from mcp import Client, Implementation

        try:
            client_info = Implementation(name="lemonade", version=__version__)
            async with Client(_watched_stdio(params, self._wake), read_timeout_seconds=self.timeout,
                              client_info=client_info) as client:
                self.info = {"protocol_version": client.protocol_version, "server_info": _dump(client.server_info),
                             "capabilities": _dump(client.server_capabilities)}
                self.tools = await self._list_tools(client)
                self.client, self.last_error = client, ""
                ready.set_result(None)
                await self._wake.wait()
                if not self._stopping:
                    self.last_error = EXITED
                    log.warning("MCP server %s: %s", self.config.id, EXITED)
        except Exception as exc:  # noqa: BLE001 - whatever stopped it is what the admin reads
            self.last_error = _failure(exc)
            log.warning("MCP server %s: %s", self.config.id, self.last_error)
            if not ready.done():
                ready.set_result(exc)
        finally:
            self.client, self.tools, self.info = None, [], {}
            if not ready.done():
                ready.set_result(RuntimeError(self.last_error or EXITED))

    async def _list_tools(self, client: Client) -> list[dict[str, Any]]:
        if client.server_capabilities.tools is None:
            return []
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            tools += [_dump(t) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise RuntimeError(f"tools/list went on past {MAX_TOOL_PAGES} pages")

    async def refresh(self) -> None:
        client = self._client()
        try:
            self.tools = await self._list_tools(client)
        except Exception as exc:  # noqa: BLE001
            raise APIError(502, f"MCP server '{self.config.id}': tools/list failed: {_failure(exc)}",
                           code="mcp_server_failed") from None

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
        client = self._client()
        try:
            result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except Exception as exc:  # noqa: BLE001
            raise APIError(502, f"MCP server '{self.config.id}': tools/call {name} failed: {_failure(exc)}",
                           code="mcp_server_failed") from None
        return _dump(result)

    def _client(self) -> Client:
        if self.client is None:
            raise APIError(502, f"MCP server '{self.config.id}' is not connected"
                           + (f": {self.last_error}" if self.last_error else ""), code="mcp_server_failed")
        return self.client

    async def disconnect(self) -> None:
        async with self._lock:
            await self._stop()
            self.last_error = ""

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        try:
            await asyncio.wait_for(task, STOP_SECONDS)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class McpHost:
    """Every registered MCP server of this server: entries, connections, tools."""

    def __init__(self, config_dir: Path, environ: Mapping[str, str] | None = None) -> None:
        self.path = Path(config_dir) / CONFIG_FILE
        self.environ = os.environ if environ is None else environ
        self.connections = {cid: Connection(c) for cid, c in load(self.path).items()}

    def _get(self, server_id: str) -> Connection:
        found = self.connections.get(server_id)
        if found is None:
            raise APIError(404, f"Unknown MCP server: {server_id!r} (GET /internal/mcp/servers lists them)",
                           type="not_found", code="mcp_server_not_found")
        return found

    def _enabled(self, server_id: str) -> Connection:
        conn = self._get(server_id)
        if not conn.config.enabled:
            raise APIError(409, f"MCP server '{server_id}' is disabled; register it again with \"enabled\": true",
                           code="mcp_server_disabled")
        return conn

    def _save(self, connections: Mapping[str, Connection]) -> None:
        save(self.path, {cid: c.config for cid, c in connections.items()})

    def servers(self) -> list[dict[str, Any]]:
        return [c.snapshot() for c in self.connections.values()]

    async def upsert(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Add or replace an entry (`body`, or its `server` object); a replaced one is disconnected."""
        raw = body.get("server") if isinstance(body.get("server"), Mapping) else body
        try:
            config = parse(raw, taken=self.connections)
        except McpConfigError as exc:
            raise APIError(400, str(exc), code="invalid_argument") from None
        old = self.connections.get(config.id)
        updated = {**self.connections, config.id: Connection(config)}
        self._save(updated)
        self.connections = updated
        if old is not None:
            await old.disconnect()
        log.info("MCP server %s %s: %s %s", config.id, "replaced" if old else "registered", config.command,
                 " ".join(config.args))
        return {"server": config.to_json()}

    async def remove(self, server_id: str) -> dict[str, Any]:
        conn = self._get(server_id)
        updated = {k: v for k, v in self.connections.items() if k != server_id}
        self._save(updated)
        self.connections = updated
        await conn.disconnect()
        return {"removed": server_id}

    async def connect(self, server_id: str) -> dict[str, Any]:
        conn = self._enabled(server_id)
        await conn.connect(self.environ)
        return {"server": conn.snapshot()}

    async def disconnect(self, server_id: str) -> dict[str, Any]:
        conn = self._get(server_id)
        await conn.disconnect()
        return {"server": conn.snapshot()}

    async def refresh(self, server_id: str) -> dict[str, Any]:
        conn = self._enabled(server_id)
        await conn.connect(self.environ)
        await conn.refresh()
        return {"server": conn.snapshot()}

    async def call(self, server_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """`tools/call`: `name`, `arguments` (an object) and an optional `timeout_ms` of its own."""
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, "'name' is required: the tool to call (a non-empty string)", code="invalid_argument")
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            raise APIError(400, "'arguments' must be a JSON object", code="invalid_argument")
        conn = self._enabled(server_id)
        try:
            timeout_ms = check_timeout(body, conn.config.timeout_ms)
        except McpConfigError as exc:
            raise APIError(400, str(exc), code="invalid_argument") from None
        await conn.connect(self.environ)
        result = await conn.call(name, arguments, timeout_ms / 1000)
        return {"server_id": server_id, "tool": name, "result": result}

    def tools(self) -> list[dict[str, Any]]:
        """The tools of every connected server, with the name and OpenAI form an LLM gets them in."""
        out = []
        for conn in self.connections.values():
            if conn.client is None:
                continue
            for tool in conn.tools:
                out.append({"server_id": conn.config.id, "server_name": conn.config.name, "name": tool["name"],
                            "chat_name": chat_tool_name(conn.config.id, tool["name"]),
                            "title": tool.get("title", ""), "description": tool.get("description", ""),
                            "inputSchema": tool.get("inputSchema", {}), "tool": tool,
                            "openai_tool": _openai_tool(conn.config, tool)})
        return out

    async def call_as_text(self, server_id: str, tool: str, arguments: dict[str, Any]) -> str:
        """A tool call for an LLM (the omni loop): its result as text, a failure as "Error: ..."."""
        try:
            conn = self._enabled(server_id)
            result = await conn.call(tool, arguments, conn.timeout)
        except APIError as exc:
            return f"Error: {exc.message}"
        return result_text(result)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.disconnect() for c in self.connections.values()), return_exceptions=True)


def _openai_tool(config: ServerConfig, tool: Mapping[str, Any]) -> dict[str, Any]:
    description = tool.get("description") or tool.get("title") or f"MCP tool {tool['name']} from {config.name}"
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict) or not schema:
        schema = {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": chat_tool_name(config.id, tool["name"]),
                                             "description": f"[{config.name}] {description}", "parameters": schema}}


def result_text(result: Mapping[str, Any]) -> str:
    """A `CallToolResult` as an LLM reads it: its text blocks (other blocks named by their type), or its
    structured content; "Error: " first when the server says the call failed."""
    parts = []
    for block in result.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        parts.append(str(block.get("text", "")) if kind == "text" else f"[{kind or 'content'}]")
    text = "\n".join(parts).strip()
    if not text and result.get("structuredContent") is not None:
        text = json.dumps(result["structuredContent"])
    return ("Error: " if result.get("isError") else "") + (text or "(no output)")
