"""`/internal/mcp/*`: the MCP servers this server connects to as a client (mcp_client/), as upstream
Lemonade's server has them (d1e42bab7).

| route | what it does |
|---|---|
| `GET /internal/mcp/servers` | every entry with its state (`status`, `last_error`, `server_info`, `tools`, ...) |
| `POST /internal/mcp/servers` | add or replace an entry (the body, or its `server` object); a replaced one stops |
| `DELETE /internal/mcp/servers/{id}` | remove an entry (and stop its server) |
| `POST /internal/mcp/servers/{id}/connect` | start the server and list its tools |
| `POST /internal/mcp/servers/{id}/disconnect` | stop it |
| `POST /internal/mcp/servers/{id}/refresh-tools` | list its tools again (connecting first if needed) |
| `POST /internal/mcp/servers/{id}/tools/call` | `{"name", "arguments", "timeout_ms"?}`: one call, its result back |
| `GET /internal/mcp/tools` | the tools of the connected servers, with the name and OpenAI form an LLM gets them in |

An entry starts a program of the admin's choosing, so these routes take the admin key
(`LEMONADE_ADMIN_API_KEY`, else `LEMONADE_API_KEY`, as every `/internal` route: api/middleware.py) and,
unlike the other `/internal` routes, are closed (403) on a server that has no key at all: with no key,
any program on this machine, or a web page it opens, could make the server run commands.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from lemonade.errors import APIError
from lemonade.mcp_client.host import McpHost
from lemonade.services import Services

ID_PATH = "{server_id}"


def _keyed(request: Request) -> None:
    svc: Services = request.app.state.services
    if not (svc.admin_key or svc.api_key):
        raise APIError(403, "MCP administration requires LEMONADE_ADMIN_API_KEY or LEMONADE_API_KEY: it starts "
                       "programs, so a server without a key does not offer it", type="permission_error",
                       code="mcp_admin_key_required")


router = APIRouter(prefix="/internal/mcp", tags=["internal"], dependencies=[Depends(_keyed)])


def _host(request: Request) -> McpHost:
    svc: Services = request.app.state.services
    return svc.mcp


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object", code="invalid_json")
    return body


@router.get("/servers")
async def list_servers(request: Request) -> dict[str, Any]:
    return {"servers": _host(request).servers()}


@router.post("/servers")
async def upsert_server(request: Request, body: Any = Body(..., examples=[{
        "id": "files", "name": "Files", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                                                      "/srv/shared"],
        "env": {"API_TOKEN": "${MY_API_TOKEN}"}, "timeout_ms": 30000}])) -> dict[str, Any]:
    return await _host(request).upsert(_object(body))


@router.delete(f"/servers/{ID_PATH}")
async def remove_server(request: Request, server_id: str) -> dict[str, Any]:
    return await _host(request).remove(server_id)


@router.post(f"/servers/{ID_PATH}/connect")
async def connect_server(request: Request, server_id: str) -> dict[str, Any]:
    return await _host(request).connect(server_id)


@router.post(f"/servers/{ID_PATH}/disconnect")
async def disconnect_server(request: Request, server_id: str) -> dict[str, Any]:
    return await _host(request).disconnect(server_id)


@router.post(f"/servers/{ID_PATH}/refresh-tools")
async def refresh_tools(request: Request, server_id: str) -> dict[str, Any]:
    return await _host(request).refresh(server_id)


@router.post(f"/servers/{ID_PATH}/tools/call")
async def call_tool(request: Request, server_id: str, body: Any = Body(..., examples=[{
        "name": "read_file", "arguments": {"path": "/srv/shared/notes.txt"}}])) -> dict[str, Any]:
    return await _host(request).call(server_id, _object(body))


@router.get("/tools")
async def list_tools(request: Request) -> dict[str, Any]:
    return {"tools": _host(request).tools()}
