"""The MCP gateway at `/mcp`: JSON-RPC 2.0 over MCP's Streamable HTTP transport, tools only.

One POST carries one message or a batch; replies come back as one JSON object or array (no SSE
channel: `GET /mcp` is 405, no `Mcp-Session-Id` is issued). A POST of notifications only is
answered 202 with no body. Protocol errors are JSON-RPC errors (-32700 parse, -32600 invalid
request, -32601 unknown method, -32602 invalid params, -32603 internal); tool failures are tool
results with `isError: true` (see tools.py). `LEMONADE_API_KEY` is enforced by the auth
middleware, as for every API route.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lemonade import __version__
from lemonade.api.mcp import tools
from lemonade.services import Services
from lemonade.util import jsonparse

log = logging.getLogger("lemonade.mcp")
router = APIRouter(tags=["mcp"])

PROTOCOL_VERSION = "2025-06-18"
SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
SILENT_NOTIFICATIONS = {"notifications/initialized", "notifications/cancelled", "notifications/progress",
                        "notifications/roots/list_changed"}
INSTRUCTIONS = ("Lemonade runs AI models on this machine. Call lemonade_list_models to see which models exist, "
                "then lemonade_chat to generate text with one of them.")


class RPCError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_reply(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def _params(message: dict[str, Any]) -> dict[str, Any]:
    params = message.get("params", {})
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RPCError(INVALID_PARAMS, "`params` must be an object")
    return params


async def _initialize(svc: Services, params: dict[str, Any]) -> dict[str, Any]:
    requested = params.get("protocolVersion")
    if not isinstance(requested, str) or not requested:
        raise RPCError(INVALID_PARAMS, "initialize needs `protocolVersion` (a string such as \"2025-06-18\")")
    version = requested if requested in SUPPORTED_VERSIONS else PROTOCOL_VERSION
    client = params.get("clientInfo")
    client = client if isinstance(client, dict) else {}
    log.info("MCP client %s %s connected (protocol %s)", client.get("name", "?"), client.get("version", ""), version)
    return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "lemonade-mcp", "title": "Lemonade", "version": __version__},
            "instructions": INSTRUCTIONS}


async def _tools_call(svc: Services, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise RPCError(INVALID_PARAMS, "tools/call needs `name` (a string)")
    if name not in tools.TOOL_NAMES:  # a tool failure, so the model can pick another (api-mcp.md)
        return tools.result(tools.text(f"Error: unknown tool '{name}'. Available: "
                                       f"{', '.join(sorted(tools.TOOL_NAMES))}"), is_error=True)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RPCError(INVALID_PARAMS, "tools/call `arguments` must be an object")
    log.info("MCP tools/call %s", name)
    return await tools.call(svc, name, arguments)


async def _dispatch(svc: Services, message: Any) -> dict[str, Any] | None:
    """The reply to one JSON-RPC message, or None for notifications (and for stray responses)."""
    if not isinstance(message, dict):
        return error_reply(None, INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be an object")
    msg_id = message.get("id")
    is_notification = "id" not in message
    if not is_notification and (isinstance(msg_id, bool) or not isinstance(msg_id, (str, int, type(None)))):
        return error_reply(None, INVALID_REQUEST, "Invalid Request: `id` must be a string or a number")
    if message.get("jsonrpc") != "2.0":
        return None if is_notification else error_reply(msg_id, INVALID_REQUEST,
                                                         "Invalid Request: `jsonrpc` must be \"2.0\"")
    method = message.get("method")
    if not isinstance(method, str) or not method:
        if "result" in message or "error" in message:
            return None  # a response to a server request; this server sends none
        return None if is_notification else error_reply(msg_id, INVALID_REQUEST,
                                                         "Invalid Request: missing `method`")
    if is_notification:
        if method not in SILENT_NOTIFICATIONS:
            log.debug("Ignoring MCP notification %s", method)
        return None
    try:
        params = _params(message)
        if method == "initialize":
            result = await _initialize(svc, params)
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": tools.TOOLS}
        elif method == "tools/call":
            result = await _tools_call(svc, params)
        else:
            raise RPCError(METHOD_NOT_FOUND, f"Method not found: {method} (this server offers initialize, ping, "
                                             "tools/list and tools/call)")
    except RPCError as exc:
        return error_reply(msg_id, exc.code, exc.message)
    except Exception as exc:  # noqa: BLE001 - reported as JSON-RPC internal error
        log.exception("MCP %s failed", method)
        return error_reply(msg_id, INTERNAL_ERROR, f"Internal error: {exc}")
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


@router.post("/mcp")
async def mcp_post(request: Request) -> Response:
    svc: Services = request.app.state.services
    raw = await request.body()
    try:
        message = jsonparse.loads(raw)
    except ValueError as exc:
        return JSONResponse(error_reply(None, PARSE_ERROR, f"Parse error: body is not valid JSON ({exc})"))
    if isinstance(message, list):
        if not message:
            return JSONResponse(error_reply(None, INVALID_REQUEST, "Invalid Request: empty batch"))
        replies = [reply for item in message if (reply := await _dispatch(svc, item)) is not None]
        return JSONResponse(replies) if replies else Response(status_code=202)
    reply = await _dispatch(svc, message)
    return JSONResponse(reply) if reply is not None else Response(status_code=202)


@router.api_route("/mcp", methods=["GET", "DELETE"], include_in_schema=False)
async def mcp_other(request: Request) -> Response:
    """No server-initiated SSE channel and no sessions: only POST is served."""
    return JSONResponse(error_reply(None, INVALID_REQUEST, f"{request.method} /mcp is not supported; send JSON-RPC "
                                    "messages with POST"), status_code=405, headers={"Allow": "POST"})
