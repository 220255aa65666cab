"""Issue 31, WebSockets: how Lemonade's app and scripts authenticate, and the live span stream.

Browsers cannot set headers on a WebSocket. Lemonade's app offers two subprotocols instead: its
application protocol `lemonade-realtime` and the key as `bearer.<base64url(key), no padding>`; the
server must select `lemonade-realtime`. OpenAI's browser form (`openai-insecure-api-key.<key>`) and
`?api_key=` keep working. Desktop apps' pages (`file://`, `app://.`, `jan://`, Tauri's
`http://tauri.localhost`) may connect; a sandboxed page's `null` origin only when it is listed.

`/spans/stream` (api/lemonade/spans.py) sends each finished inference span to whoever may see it:
the admin key sees all, a key its own requests', a guest (no key on the server) only its own client
session's. Spans come from real requests; a request for an unknown model is an error span, so no
engine is needed here (the spans of served requests are in test_telemetry.py).

The server runs without engines; the clients are the `websockets` package and httpx.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect

from tests.helpers import Server, ServerFactory

USER_KEY, ADMIN_KEY = "user-k3y", "admin-k3y"
ERROR_TIMEOUT = 3.0  # how long a span that is due may take; one that must not come is waited for as long


def credential(key: str) -> str:
    return "bearer." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def app_protocols(key: str) -> list[str]:
    return ["lemonade-realtime", credential(key)]


@pytest.fixture(scope="module")
def factory(tmp_path_factory) -> ServerFactory:
    f = ServerFactory(tmp_path_factory, None)
    yield f
    f.close()


@pytest.fixture(scope="module")
def keyed(factory) -> Server:
    return factory(env={"LEMONADE_API_KEY": USER_KEY, "LEMONADE_ADMIN_API_KEY": ADMIN_KEY}, engines=())


@pytest.fixture(scope="module")
def open_server(factory) -> Server:
    """No key at all: every client is a guest."""
    return factory(engines=())


def ws_port(server: Server, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(server.url + "/v1/health", headers=headers).json()["websocket_port"]


def refused(url: str, **kw: Any) -> int:
    async def run() -> int:
        try:
            async with connect(url, **kw):
                return 101
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code
    return asyncio.run(run())


def ask_unknown_model(server: Server, key: str | None = None, session: str | None = None,
                      model: str = "no-such-model") -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if session:
        headers["X-Client-Session-Id"] = session
    resp = httpx.post(server.url + "/v1/chat/completions", headers=headers,
                      json={"model": model, "messages": [{"role": "user", "content": "hello"}]})
    assert resp.status_code == 404


async def next_span(ws: Any, timeout: float = ERROR_TIMEOUT) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def nothing_more(ws: Any) -> bool:
    try:
        await asyncio.wait_for(ws.recv(), ERROR_TIMEOUT)
    except TimeoutError:
        return True
    return False


def model_of(span: dict[str, Any]) -> str:
    return next(a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "llm.model_name")


# ----- Lemonade's app: `lemonade-realtime` + `bearer.<base64url>` ----------------------------------

def test_app_subprotocols_on_both_ports(keyed):
    async def run(port: int) -> None:
        base = f"ws://127.0.0.1:{port}"
        for path in ("/realtime", "/v1/realtime"):
            async with connect(base + path, subprotocols=app_protocols(USER_KEY)) as ws:
                assert ws.subprotocol == "lemonade-realtime"  # never the credential echoed back
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "session.created"
        for path in ("/logs/stream", "/api/v1/logs/stream"):
            async with connect(base + path, subprotocols=app_protocols(ADMIN_KEY)) as ws:
                assert ws.subprotocol == "lemonade-realtime"
                await ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "logs.snapshot"

    for port in (keyed.port, ws_port(keyed, USER_KEY)):
        asyncio.run(run(port))


def test_wrong_or_missing_credentials_are_refused_at_the_handshake(keyed):
    for port in (keyed.port, ws_port(keyed, USER_KEY)):
        for path in ("/realtime", "/logs/stream"):
            url = f"ws://127.0.0.1:{port}{path}"
            assert refused(url) == 403
            assert refused(url, subprotocols=app_protocols("not-the-key")) == 403
            assert refused(url, subprotocols=["lemonade-realtime", "bearer.%%%"]) == 403  # not base64url
            assert refused(url + f"?api_key={USER_KEY}") == 101  # the older forms still work
            assert refused(url, subprotocols=["realtime", f"openai-insecure-api-key.{USER_KEY}"]) == 101


def test_desktop_app_origins(keyed, factory):
    url = f"ws://127.0.0.1:{keyed.port}/logs/stream"
    for origin in ("file://", "app://.", "jan://app", "http://tauri.localhost", "http://localhost:5173"):
        assert refused(url, subprotocols=app_protocols(USER_KEY), origin=origin) == 101, origin
    for origin in ("null", "http://evil.example.com"):
        assert refused(url, subprotocols=app_protocols(USER_KEY), origin=origin) == 403, origin
    # A sandboxed page's opaque origin, allowed by name on another server.
    listed = factory(env={"LEMONADE_API_KEY": USER_KEY, "LEMONADE_ALLOWED_ORIGINS": "null"}, engines=())
    for port in (listed.port, ws_port(listed, USER_KEY)):
        assert refused(f"ws://127.0.0.1:{port}/logs/stream", subprotocols=app_protocols(USER_KEY),
                       origin="null") == 101


def test_preflight_private_network_and_vary(open_server):
    allowed = httpx.options(open_server.url + "/api/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Private-Network": "true"})
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert allowed.headers["access-control-allow-private-network"] == "true"
    assert allowed.headers["vary"] == "Origin"
    foreign = httpx.options(open_server.url + "/api/v1/chat/completions", headers={
        "Origin": "http://malicious.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Private-Network": "true"})
    assert foreign.status_code == 403 and foreign.headers["vary"] == "Origin"
    assert "access-control-allow-origin" not in foreign.headers
    assert "access-control-allow-private-network" not in foreign.headers
    # An answer to a client without Origin (a script) still says that it depends on the Origin.
    plain = httpx.get(open_server.url + "/v1/models")
    assert plain.status_code == 200 and plain.headers["vary"] == "Origin"


# ----- /spans/stream ------------------------------------------------------------------------------

def test_anonymous_span_listener_must_authenticate(keyed):
    async def run() -> None:
        async with connect(f"ws://127.0.0.1:{keyed.port}/spans/stream") as ws:
            await ws.send(json.dumps({"type": "logs.subscribe"}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and "authenticate first" in reply["error"]["message"]
            ask_unknown_model(keyed, USER_KEY, model="before-auth")
            await ws.send(json.dumps({"type": "auth", "token": "wrong"}))
            assert json.loads(await ws.recv())["error"]["message"] == "Invalid API key"
            await ws.send(json.dumps({"type": "auth", "token": USER_KEY}))
            assert json.loads(await ws.recv()) == {"type": "auth.ok"}
            ask_unknown_model(keyed, USER_KEY, model="after-auth")
            assert model_of(await next_span(ws)) == "after-auth"  # nothing from before it authenticated

    asyncio.run(run())
    assert refused(f"ws://127.0.0.1:{keyed.port}/spans/stream?api_key=wrong") == 403  # a wrong key: no entry


def test_admin_sees_all_and_a_key_its_own(keyed):
    async def run(port: int) -> None:
        async with connect(f"ws://127.0.0.1:{port}/v1/spans/stream", subprotocols=app_protocols(ADMIN_KEY)) as admin, \
                connect(f"ws://127.0.0.1:{port}/traces/stream?api_key={USER_KEY}") as user:
            ask_unknown_model(keyed, USER_KEY, model="users-model")
            ask_unknown_model(keyed, ADMIN_KEY, model="admins-model")
            seen = [await next_span(admin), await next_span(admin)]
            assert sorted(model_of(s) for s in seen) == ["admins-model", "users-model"]
            mine = await next_span(user)
            assert model_of(mine) == "users-model" and await nothing_more(user)
            for span in (*seen, mine):
                assert span["name"] == "chat.completions" and span["status"]["code"] == 2
                assert "users-model" in span["status"]["message"] or "admins-model" in span["status"]["message"]
                assert not [a for a in span["attributes"] if a["key"].startswith("lemon.auth_token")]

    asyncio.run(run(keyed.port))
    asyncio.run(run(ws_port(keyed, ADMIN_KEY)))


def test_guests_see_only_their_client_session(open_server):
    async def run() -> None:
        base = f"ws://127.0.0.1:{open_server.port}/spans/stream"
        async with connect(base + "?client_session_id=tab-1") as tab1, connect(base) as other:
            await other.send(json.dumps({"type": "auth"}))  # no key needed here, and no session named
            assert json.loads(await other.recv()) == {"type": "auth.ok"}
            ask_unknown_model(open_server, session="tab-1", model="tab1-model")
            ask_unknown_model(open_server, session="tab-2", model="tab2-model")
            ask_unknown_model(open_server, key="someones-token", session="tab-1", model="private-model")
            span = await next_span(tab1)
            assert model_of(span) == "tab1-model"
            assert {"key": "lemon.client_session_id", "value": {"stringValue": "tab-1"}} in span["attributes"]
            assert await nothing_more(tab1) and await nothing_more(other)

    asyncio.run(run())
