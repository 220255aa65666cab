"""Issue 2: the server process, route conventions, configuration, status endpoints, security,
logs and metrics, all over real HTTP against the real server process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import websockets.exceptions
import websockets.sync.client as ws_client

from tests.gguf_factory import write_gguf

PREFIXES = ("/api/v1", "/api/v0", "/v1", "/v0")


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers()


# ----- process ---------------------------------------------------------------------------------

def test_live_get_and_head(server):
    with server.client() as c:
        assert c.get("/live").json() == {"status": "ok"}
        head = c.head("/live")
        assert head.status_code == 200 and head.content == b""


def test_second_server_on_busy_port_exits_naming_the_port(server, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(server.port)],
                          env={"LEMONADE_CACHE_DIR": str(tmp_path), "LEMONADE_CONFIG_DIR": str(tmp_path),
                               "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert str(server.port) in proc.stderr and "in use" in proc.stderr


def test_websocket_port_equal_to_the_server_port_is_refused(tmp_path):
    from lemonade.util.ports import free_port

    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port),
                           "--websocket-port", str(port)],
                          env={"LEMONADE_CACHE_DIR": str(tmp_path), "LEMONADE_CONFIG_DIR": str(tmp_path),
                               "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"cannot be the server's port {port}" in proc.stderr and "auto" in proc.stderr


def test_ports_for_engines_are_free_and_never_from_the_ephemeral_range():
    """Outgoing connections take their local port from the ephemeral range: a port handed out there
    could be taken before the engine binds it (util/ports.py)."""
    import socket

    from lemonade.util.ports import ephemeral_range, free_port

    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low >= 21000:  # else (an unusual configuration) the OS picks them
        assert all(20000 <= p < low for p in ports)
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_shuts_down_cleanly(make_server, sig):
    srv = make_server()
    assert srv.stop(sig) == 0


# ----- routes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", PREFIXES)
def test_api_routes_under_every_prefix(server, prefix):
    with server.client() as c:
        for path in ("/health", "/stats", "/system-stats", "/models"):
            assert c.get(prefix + path).status_code == 200, prefix + path


def test_root_only_routes(server):
    with server.client() as c:
        assert c.get("/metrics").status_code == 200
        assert c.head("/metrics").status_code == 200
        for prefix in PREFIXES:
            assert c.get(prefix + "/live").status_code == 404
            assert c.get(prefix + "/metrics").status_code == 404
            assert c.get(prefix + "/internal/config").status_code == 404
        assert c.get("/internal/config").status_code == 200


def test_every_documented_path_is_routed(server):
    """Each path of the OpenAPI document reaches its route (api/app.py turns away paths outside a
    router's routes before FastAPI tries them one by one; this proves none is turned away wrongly).
    OPTIONS, a method no route takes, gives 405 for a path that matched a route and 404 otherwise,
    without running anything."""
    with server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
        assert "/api/chat" in paths and "/v1/chat/completions" in paths and "/api/v0/models/{model_id}" in paths
        for path in paths:
            concrete = re.sub(r"{[^}]+}", "x", path)
            assert c.options(concrete).status_code == 405, path
        assert c.options("/v1/no-such-thing").status_code == 404


def test_unknown_route_is_json_404(server):
    with server.client() as c:
        resp = c.get("/v1/no-such-thing")
    assert resp.status_code == 404
    assert "/v1/no-such-thing" in resp.json()["error"]["message"]


def test_openapi_describes_routes(server):
    with server.client() as c:
        spec = c.get("/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/models", "/v1/load", "/api/v1/health", "/live", "/metrics",
                 "/internal/set", "/v1/rerank", "/v1/models/{model_id}/options"):
        assert path in spec["paths"], path


def _resolve(spec: dict, schema: dict) -> dict:
    ref = schema.get("$ref", "")
    return spec["components"]["schemas"][ref.rsplit("/", 1)[-1]] if ref else schema


def test_openapi_types_every_success_answer(server):
    """Every operation documents what it answers on success (api/responses.py), so clients and the
    fuzz run can check the fields; only Ollama's always-refused routes document none."""
    with server.client() as c:
        spec = c.get("/openapi.json").json()
    untyped = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            ok = op["responses"].get("200") or op["responses"].get("202")  # 202: POST /v1/jobs
            if ok is None:
                assert path.startswith(("/api/create", "/api/copy", "/api/push", "/api/blobs")), (method, path)
                continue
            for media, content in ok.get("content", {}).items():
                schema = _resolve(spec, content.get("schema") or {})
                if media == "application/json" and not ({"properties", "items"} & schema.keys()):
                    untyped.append(f"{method.upper()} {path}")
    assert not untyped, untyped
    health = _resolve(spec, spec["paths"]["/v1/health"]["get"]["responses"]["200"]["content"]["application/json"]
                      ["schema"])
    assert {"status", "version", "all_models_loaded", "max_models"} <= set(health["required"])
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= chat.keys()
    tags = spec["paths"]["/api/tags"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert _resolve(spec, tags)["properties"]["models"]["items"]["$ref"].endswith("/OllamaModel")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/load", "/v1/models/register", "/internal/set",
                                  "/v1/embeddings", "/v1/install"])
def test_malformed_json_is_400(server, path):
    with server.client() as c:
        resp = c.post(path, content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "JSON" in resp.json()["error"]["message"]


def test_wrong_types_and_missing_fields_name_the_field(server):
    with server.client() as c:
        resp = c.post("/v1/chat/completions", json={"model": "x", "messages": "hello"})
        assert resp.status_code == 400 and "messages" in resp.json()["error"]["message"]
        resp = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 400
        # Lemonade's router words and types it so (api/errors.py NO_MODEL); its clients match on both
        assert resp.json()["error"]["message"] == "Missing required field 'model': no model specified in request"
        assert resp.json()["error"]["type"] == "invalid_request"
        assert resp.json()["error"]["code"] == "missing_argument"
        resp = c.post("/api/v1/embeddings", json={"input": "hi"})
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request"
        assert "no model specified" in resp.json()["error"]["message"]
        resp = c.post("/v1/audio/speech", json={"input": "hi"})  # not one the router picks by model: OpenAI's type
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
        resp = c.post("/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "h"}],
                                                    "temperature": "hot"})
        assert resp.status_code == 400 and "temperature" in resp.json()["error"]["message"]


BAD_BODIES = [b"", b"{not json", b"\x99\xcd binary", b"[1, 2]", b'"text"', b'{"model": 5}',
              b'{"messages": [{"role": "user", "content": "hi"}]}', b'{"model": "no-such-model", "messages": []}',
              b'{"model": "x", "messages": "hello"}', b'{"model": "x", "prompt": "hi", "max_tokens": "many"}',
              b'{"model": "x", "input": ["a", 3]}', b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v0/completions", "/v1/embeddings", "/v1/responses",
                                  "/v1/messages", "/api/chat", "/api/generate"])
def test_direct_routes_answer_as_fastapi_does(server, path):
    """api/direct.py serves these routes for `application/json` bodies; any other JSON media type
    (`application/merge-patch+json` here) still goes through FastAPI. Both must answer alike."""
    with server.client() as c:
        for body in BAD_BODIES:
            direct = c.post(path, content=body, headers={"content-type": "application/json"})
            fastapi = c.post(path, content=body, headers={"content-type": "application/merge-patch+json"})
            assert 400 <= direct.status_code < 500, (body, direct.text)
            assert (direct.status_code, direct.json()) == (fastapi.status_code, fastapi.json()), body


# ----- configuration ---------------------------------------------------------------------------

def test_config_get_set_persists_and_applies(make_server):
    srv = make_server()
    with srv.client() as c:
        cfg = c.get("/internal/config").json()
        assert cfg["port"] == srv.port and cfg["max_loaded_models"] == 1 and cfg["ctx_size"] == -1
        assert set(cfg["llamacpp"]) >= {"backend", "args", "prefer_system"}
        assert set(cfg["sdcpp"]) >= {"backend", "args", "steps", "cfg_scale", "width", "height"}
        # A flag the installed llama-server does not know: refused, nothing saved (the spec's `--no-mmap`,
        # which the pinned build renamed, is translated instead: tests/test_serving.py).
        resp = c.post("/internal/set", json={"max_loaded_models": 3, "llamacpp": {"args": "--no-such-flag"}})
        assert resp.status_code == 400 and "'--no-such-flag'" in resp.json()["error"]["message"], resp.text
        saved = srv.config_dir / "config.json"
        assert not saved.exists() or "no-such-flag" not in saved.read_text()
        resp = c.post("/internal/set", json={"max_loaded_models": 3, "llamacpp": {"args": "--threads 2"}})
        assert resp.status_code == 200, resp.text
        on_disk = json.loads((srv.config_dir / "config.json").read_text())
        assert on_disk == {"max_loaded_models": 3, "llamacpp": {"args": "--threads 2"}}
        assert c.get("/v1/health").json()["max_models"]["llm"] == 3  # applied live
        assert c.get("/internal/config").json()["llamacpp"]["args"] == "--threads 2"


@pytest.mark.parametrize("body,needle", [
    ({"max_loaded_models": "two"}, "max_loaded_models"),
    ({"no_such_key": 1}, "no_such_key"),
    ({"llamacpp": {"nope": 1}}, "llamacpp.nope"),
    ({"port": 70000}, "port"),
    ({"ctx_size": 0}, "ctx_size"),
    ({"offline": "yes"}, "offline"),
    ({"max_loaded_models": 2, "log_level": "loud"}, "log_level"),
])
def test_invalid_config_refused_and_file_untouched(server, body, needle):
    path = server.config_dir / "config.json"
    before = path.read_bytes() if path.exists() else None
    with server.client() as c:
        resp = c.post("/internal/set", json=body)
    assert resp.status_code == 400 and needle in resp.json()["error"]["message"]
    assert (path.read_bytes() if path.exists() else None) == before


def test_env_and_flags_override_file(make_server):
    srv = make_server(config={"max_loaded_models": 2, "ctx_size": 1024},
                      env={"LEMONADE_MAX_LOADED_MODELS": "4", "LEMONADE_LLAMACPP_ARGS": "--threads 1"},
                      args=["--ctx-size", "2048"])
    with srv.client() as c:
        cfg = c.get("/internal/config").json()
    assert cfg["max_loaded_models"] == 4 and cfg["llamacpp"]["args"] == "--threads 1" and cfg["ctx_size"] == 2048


# ----- status ----------------------------------------------------------------------------------

def test_health_before_anything_loaded(server):
    with server.client() as c:
        health = c.get("/v1/health").json()
    assert health["status"] == "ok" and health["version"]
    assert health["all_models_loaded"] == [] and health["model_loaded"] is None
    kinds = {"llm", "embedding", "reranking", "transcription", "image", "tts"}
    assert set(health["max_models"]) == kinds and set(health["pinned_models"]) == kinds
    assert all(v == 1 for v in health["max_models"].values())
    assert health["telemetry"] == {"enabled": False} and isinstance(health["update_check_done"], bool)


def test_stats_before_any_request(make_server):
    srv = make_server()
    with srv.client() as c:
        stats = c.get("/v1/stats").json()
    for key in ("time_to_first_token", "tokens_per_second", "input_tokens", "output_tokens", "prompt_tokens",
                "cache_tokens", "draft_tokens", "draft_accepted_tokens", "draft_acceptance_rate",
                "speculative_speedup"):
        assert stats[key] is None
    for key in ("request_count_total", "input_tokens_total", "output_tokens_total", "prompt_tokens_total",
                "cache_tokens_total", "draft_tokens_total", "draft_accepted_tokens_total"):
        assert stats[key] == 0
    assert stats["speculation"] == {}  # per model, once a model answers (tests/test_speculative.py)


def test_system_stats_and_info(server):
    with server.client() as c:
        stats = c.get("/v1/system-stats").json()
        info = c.get("/v1/system-info").json()
    assert isinstance(stats["cpu_percent"], (int, float)) and stats["memory_gb"] > 0
    assert stats["gpu_percent"] is None and stats["vram_gb"] is None and stats["npu_percent"] is None
    assert info["OS Version"] and info["Processor"] and info["Physical Memory"]
    storage = info["model_storage"]
    assert storage["total_bytes"] >= storage["used_bytes"] > 0 and storage["free_bytes"] > 0
    assert info["devices"]["cpu"]["cores"] >= 1
    llama = info["recipes"]["llamacpp"]["backends"]
    assert llama["cpu"]["state"] == "installed" and llama["cpu"]["version"]
    for backend in llama.values():
        assert backend["state"] in ("installed", "installable", "update_required", "unsupported")
        if backend["state"] != "installed":
            assert backend["message"]
    assert info["recipes"]["whispercpp"]["backends"]


# ----- security --------------------------------------------------------------------------------

def test_api_key_guards_every_api_route(make_server):
    srv = make_server(env={"LEMONADE_API_KEY": "sekret", "LEMONADE_ADMIN_API_KEY": "admin"})
    good = {"Authorization": "Bearer sekret"}
    admin = {"Authorization": "Bearer admin"}
    with srv.client() as c:
        assert c.get("/live").status_code == 200  # liveness probes stay open
        for path in ("/v1/models", "/api/v1/health", "/v0/stats", "/api/tags", "/metrics"):
            resp = c.get(path)
            assert resp.status_code == 401, path
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers=good).status_code == 200
        assert c.get("/metrics", headers=good).status_code == 200
        assert c.get("/metrics", headers=admin).status_code == 200
        # /internal needs the admin key; the API key is not enough, and nothing changes on refusal
        assert c.post("/internal/set", json={"max_loaded_models": 5}, headers=good).status_code == 401
        assert not (srv.config_dir / "config.json").exists()
        assert c.post("/internal/set", json={"max_loaded_models": 5}, headers=admin).status_code == 200
        body = c.get("/v1/models").json()
        assert body["error"]["type"] == "authentication_error"
        # An allowed page reads its 401 (CORS headers on the refusal too), and a preflight needs no key.
        page = {"Origin": "http://localhost:5173"}
        refused = c.get("/v1/models", headers=page)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page["Origin"]
        preflight = c.options("/v1/models", headers={**page, "Access-Control-Request-Method": "GET"})
        assert preflight.status_code == 204
    url = srv.url.replace("http", "ws") + "/logs/stream"
    with pytest.raises((websockets.exceptions.ConnectionClosed, websockets.exceptions.InvalidStatus)):
        with ws_client.connect(url) as ws:
            ws.send(json.dumps({"type": "logs.subscribe"}))
            ws.recv(timeout=5)
    with ws_client.connect(url + "?api_key=sekret") as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
        assert json.loads(ws.recv(timeout=5))["type"] == "logs.snapshot"


def srv_extra_dir(make_server) -> Path:
    """An extra models dir holding one small GGUF (metadata only: never loaded here)."""
    folder = make_server.tmp.mktemp("extra")
    write_gguf(folder / "mine.gguf")
    return folder


def test_websocket_key_as_subprotocol_and_paths_only_for_admins(make_server):
    """Browsers cannot set Authorization on a WebSocket: the key rides in Sec-WebSocket-Protocol
    (OpenAI's `openai-insecure-api-key.<KEY>`), and the chosen subprotocol is echoed. Log lines show
    filesystem paths only to admins, and so do the checkpoints of extra-dir models."""
    extra = srv_extra_dir(make_server)
    srv = make_server(env={"LEMONADE_API_KEY": "sekret", "LEMONADE_ADMIN_API_KEY": "admin",
                           "LEMONADE_EXTRA_MODELS_DIR": str(extra)})
    url = srv.url.replace("http", "ws") + "/logs/stream"

    def first_lines(key: str) -> str:
        with ws_client.connect(url, subprotocols=["lemonade-logs", f"openai-insecure-api-key.{key}"]) as ws:
            assert ws.subprotocol == "lemonade-logs"
            ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
            return json.dumps(json.loads(ws.recv(timeout=5))["entries"])

    with pytest.raises(websockets.exceptions.InvalidStatus):
        first_lines("wrong")
    user_view, admin_view = first_lines("sekret"), first_lines("admin")
    assert "cache dir <cache>" in user_view and str(srv.cache) not in user_view
    assert f"cache dir {srv.cache}" in admin_view
    with srv.client() as c:
        def storage(key: str, query: str = "") -> str:
            info = c.get("/v1/system-info" + query, headers={"Authorization": f"Bearer {key}"}).json()
            return info["model_storage"]["path"]

        assert storage("sekret").startswith("<cache>") and storage("admin").startswith(str(srv.cache))
        assert storage("sekret", "?include_paths=true").startswith(str(srv.cache))  # asked for

        def checkpoint(key: str, query: str = "") -> str:
            return c.get("/v1/models/mine" + query, headers={"Authorization": f"Bearer {key}"}).json()["checkpoint"]

        assert checkpoint("sekret") == "mine.gguf" and checkpoint("admin") == str(extra / "mine.gguf")
        assert checkpoint("sekret", "?include_paths=true") == str(extra / "mine.gguf")


# Routes any client may call without a key: liveness probes (Ollama's `/` too) and the API description.
OPEN_ROUTES = {"/", "/live", "/openapi.json", "/docs", "/redoc",
               "/renderer.bundle.js", "/web-app", "/web-app/x"}  # the web app's files: its page asks for the key


def served_routes() -> tuple[list[tuple[str, str]], list[str]]:
    """Every (method, path) and WebSocket path the app serves, read from the app itself: the OpenAPI
    document leaves out WebSockets and hidden routes, and a hand-made list would miss new ones."""
    import tempfile
    from pathlib import Path

    from fastapi.routing import iter_route_contexts
    from starlette.routing import WebSocketRoute

    from lemonade.api.app import create_app
    from lemonade.config import Config
    from lemonade.observability.logs import LogBuffer
    from lemonade.services import Services

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Services(Path(tmp), Config(Path(tmp), environ={}), LogBuffer()))
        http: list[tuple[str, str]] = []
        sockets: list[str] = []
        for route in iter_route_contexts(app.routes):
            path = re.sub(r"\{[^}]+\}", "x", route.path)
            if isinstance(route.original_route, WebSocketRoute):
                sockets.append(path)
            else:
                http.extend((method, path) for method in sorted(route.methods or ()))
    return http, sockets


def test_every_route_needs_its_key(make_server):
    """Each route the app serves, WebSockets and /mcp included, refuses a missing or wrong key with
    401 (or a 1008 close), takes the right one, and `/internal/*` takes the admin key only."""
    http, sockets = served_routes()
    assert ("POST", "/mcp") in http and "/logs/stream" in sockets and len(http) > 150
    srv = make_server(env={"LEMONADE_API_KEY": "sekret", "LEMONADE_ADMIN_API_KEY": "admin", "HF_HUB_OFFLINE": "1"})
    keys = {"none": {}, "wrong": {"Authorization": "Bearer wrong"}, "api": {"Authorization": "Bearer sekret"},
            "admin": {"Authorization": "Bearer admin"}}
    with srv.client(timeout=60) as c:
        for method, path in http:
            if path == "/internal/shutdown":  # with the admin key it stops the server: asked last, below
                continue
            got = {name: c.request(method, path, headers=headers, content=b"{}" if method != "GET" else None)
                   .status_code for name, headers in keys.items()}
            if path in OPEN_ROUTES:
                assert 401 not in got.values(), (method, path, got)
                continue
            if path.startswith("/peers/"):  # the peer key guards them, not the API key: without one, 403 to all
                assert set(got.values()) == {403}, (method, path, got)
                continue
            internal = path.startswith("/internal")
            expected = {"none": True, "wrong": True, "api": internal, "admin": False}
            assert {name: code == 401 for name, code in got.items()} == expected, (method, path, got)
    base = srv.url.replace("http", "ws")
    for path in sockets:
        spans = path.endswith(("/spans/stream", "/traces/stream"))
        for query in ("", "?api_key=wrong"):
            if spans and not query:  # opens without a key (a page cannot send one), serves nothing until `auth`
                with ws_client.connect(base + path) as ws:
                    ws.send(json.dumps({"type": "logs.subscribe"}))
                    assert "authenticate first" in json.loads(ws.recv(timeout=5))["error"]["message"], path
                continue
            with pytest.raises((websockets.exceptions.ConnectionClosed, websockets.exceptions.InvalidStatus)):
                with ws_client.connect(base + path + query) as ws:
                    ws.send(json.dumps({"type": "logs.subscribe"}))
                    ws.recv(timeout=5)
        # With the key, each socket opens with its own first message (the realtime API speaks first).
        first = "session.created" if path.endswith("/realtime") else "auth.ok" if spans else "logs.snapshot"
        for query, headers in (("?api_key=sekret", {}), ("", keys["api"])):
            with ws_client.connect(base + path + query, additional_headers=headers) as ws:
                if first == "logs.snapshot":
                    ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
                if first == "auth.ok":
                    ws.send(json.dumps({"type": "auth", "token": "sekret"}))
                assert json.loads(ws.recv(timeout=5))["type"] == first, path
    with srv.client(timeout=60) as c:
        got = {name: c.post("/internal/shutdown", headers=headers).status_code for name, headers in keys.items()}
    assert got == {"none": 401, "wrong": 401, "api": 401, "admin": 200}


def test_admin_key_alone_leaves_api_open_and_metrics_open(make_server):
    srv = make_server(env={"LEMONADE_ADMIN_API_KEY": "admin"})
    with srv.client() as c:
        assert c.get("/v1/models").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/internal/config").status_code == 401
        assert c.get("/internal/config", headers={"Authorization": "Bearer admin"}).status_code == 200


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://localhost:5173", True), ("http://127.0.0.1:3000", True), ("http://[::1]:8080", True),
    ("http://app.localhost", True), ("vscode-webview://1234", True), ("app://.", True), ("file://", True),
    ("https://evil.example", False), ("http://localhost.evil.example", False), ("null", False),
])
def test_origin_policy(server, origin, allowed):
    """guide-configuration-README.md "Allowed Origins": loopback pages and desktop apps, nothing else."""
    with server.client() as c:
        preflight = c.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization"})
        call = c.get("/v1/models", headers={"Origin": origin})
    if allowed:
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == origin
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        assert call.status_code == 200 and call.headers["access-control-allow-origin"] == origin
    else:
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
        assert call.status_code == 403 and "LEMONADE_ALLOWED_ORIGINS" in call.json()["error"]["message"]
        assert "access-control-allow-origin" not in call.headers


def test_foreign_pages_cannot_drive_the_server(server):
    """A cross-site "simple" request (text/plain, no preflight) is refused, and even an allowed page's
    text/plain body is not read as JSON; curl-style bodies from non-browsers still are."""
    body = json.dumps({"model_name": "No-Such-Model"})
    with server.client() as c:
        foreign = c.post("/v1/load", content=body, headers={"Origin": "https://evil.example",
                                                            "Content-Type": "text/plain"})
        assert foreign.status_code == 403
        page = c.post("/v1/load", content=body, headers={"Origin": "http://localhost:3000",
                                                         "Content-Type": "text/plain"})
        assert page.status_code == 400 and page.json()["error"]["code"] == "invalid_json"
        curl = c.post("/v1/load", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert curl.status_code == 404  # read as JSON: the model name was understood
        # DNS rebinding: the browser thinks evil.example is same-origin, but it sends its own Host.
        rebound = c.get("/v1/models", headers={"Host": f"evil.example:{server.port}"})
        assert rebound.status_code == 403 and "DNS rebinding" in rebound.json()["error"]["message"]
        assert c.get("/v1/models", headers={"Host": f"localhost:{server.port}"}).status_code == 200


def test_allowed_origins_widen_the_list_and_apply_to_websockets(make_server):
    srv = make_server(env={"LEMONADE_ALLOWED_ORIGINS": "https://app.example.com, null"})
    with srv.client() as c:
        for origin, status in (("https://app.example.com", 200), ("null", 200), ("https://evil.example", 403)):
            assert c.get("/v1/models", headers={"Origin": origin}).status_code == status, origin
        # The listed origin's host is a served name too (a reverse proxy in front of the server).
        assert c.get("/v1/models", headers={"Host": "app.example.com"}).status_code == 200
    url = srv.url.replace("http", "ws") + "/logs/stream"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:  # no cross-site WebSocket hijacking
        with ws_client.connect(url, origin="https://evil.example"):
            pass
    assert refused.value.response.status_code == 403
    with ws_client.connect(url, origin="https://app.example.com") as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
        assert json.loads(ws.recv(timeout=5))["type"] == "logs.snapshot"


# ----- logs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", "/api/v1", "/v1"])
def test_log_stream_snapshot_live_and_errors(server, prefix):
    url = server.url.replace("http", "ws") + prefix + "/logs/stream"
    with ws_client.connect(url) as ws:
        ws.send("not json")
        assert json.loads(ws.recv(timeout=5))["type"] == "error"
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": "x"}))
        assert json.loads(ws.recv(timeout=5))["type"] == "error"
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
        snap = json.loads(ws.recv(timeout=5))
        assert snap["type"] == "logs.snapshot" and snap["entries"]
        entry = snap["entries"][0]
        assert set(entry) == {"seq", "timestamp", "severity", "tag", "line"}
        last = snap["entries"][-1]["seq"]
        # cause a new log line: a configuration change is logged
        with server.client() as c:
            c.post("/internal/set", json={"auto_check_model_updates": False})
        live = json.loads(ws.recv(timeout=5))
        assert live["type"] == "logs.entry" and live["entry"]["seq"] > last
    with ws_client.connect(url) as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": last}))
        resumed = json.loads(ws.recv(timeout=5))
        assert all(e["seq"] > last for e in resumed["entries"])


# ----- metrics ---------------------------------------------------------------------------------

def test_metrics_exposition(server):
    with server.client() as c:
        c.get("/v1/models")
        resp = c.get("/metrics")
    assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = resp.text
    assert "lemonade_server_up 1.0" in text
    assert 'lemonade_server_info{version="' in text
    assert 'lemonade_http_requests_total{family="openai",method="GET",status="200"}' in text
    assert "lemonade_http_request_duration_seconds_bucket" in text
    assert 'lemonade_models_loaded{type="llm"} 0.0' in text
