"""Every route the server answers, and what it means: one row per path, read by every part that asks.

A path's row says where it is served (under each API prefix, at the root, or under Ollama's
`/api`), which API family it belongs to (and so which error shape it answers with), how `/metrics`
counts it, the span it makes when it is traced inference, whether `"stream": true` gets a stream,
its documented success answer per method, whether its errors may be Lemonade's plain
`{"error": "<message>"}`, where the request names its model, and whether it is open without a key.
The guard (api/guard.py: auth, spans, metrics), the error handlers (api/errors.py) and the OpenAPI
builder (api/openapi.py) all read it, so no part keeps a path list of its own;
tests/unit/test_route_table.py checks that the app serves exactly these paths with these methods.

Plain data on the ground floor: it imports nothing of ours, so any layer may ask `route_of(path)`.
Success answers are named, not imported: a name is a model or schema in api/responses.py, which is
imported only when `/openapi.json` is first built.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# Lemonade's API prefixes: every API route is served under each. Most used first (FastAPI tries the
# routes in the order they are included); no prefix plus "/" starts another, so stripping one needs
# no particular order.
PREFIXES = ("/v1", "/api/v1", "/v0", "/api/v0")
OLLAMA_PREFIX = "/api"  # the Ollama API (`/api/chat`, ...): any `/api/...` path that is not under a prefix

# Where a route is served.
API = frozenset({"api"})  # under each of PREFIXES
ROOT = frozenset({"root"})  # at the root only
OLLAMA = frozenset({"ollama"})  # under OLLAMA_PREFIX
ROOT_AND_API = ROOT | API  # the WebSockets: bare and under each prefix

# A method's success answer, besides the name of a model or schema in api/responses.py:
EMPTY = "<empty>"  # success with an empty body
OWN = "<own>"  # documented by the route itself (FastAPI `responses=`, a 202, a file or an event stream)
REFUSED = "<refused>"  # the operation always refuses: no success answer to document (Ollama's model uploads)

FAMILIES = ("openai", "ollama", "anthropic", "lemonade", "llamacpp", "internal", "mcp")


@dataclass(frozen=True)
class RouteInfo:
    path: str  # after the prefix: "/chat/completions", "/models/{model_id}"; a root route's whole path
    family: str  # the API it belongs to, one of FAMILIES
    mounts: frozenset[str] = API
    # The success answer of each method served (None: that method is not served), see EMPTY/OWN/REFUSED.
    get: str | None = None
    head: str | None = None
    post: str | None = None
    delete: str | None = None
    websocket: bool = False
    metrics: str = ""  # the `family` label of lemonade_http_requests_total; "" = the API family
    # Traced inference, (OpenInference span kind, span name): the routes Lemonade's router serves by
    # `model` (api/errors.py words a missing one as it does).
    span: tuple[str, str] | None = None
    streams: bool = False  # `"stream": true` is answered with SSE (Ollama: NDJSON)
    plain_error: bool = False  # its errors may be Lemonade's plain `{"error": "<message>"}` (api/openapi.py)
    # Where the request names a model: "<json|form|query|path>:<field>[|<field>...]", the first field
    # present wins ("json:model|name": Ollama's older clients send `name`); None: it names none.
    model_field: str | None = None
    open: bool = False  # answered without an API key (the web app asks for the key itself)
    auth_in_messages: bool = False  # a WebSocket that may connect without a key and authenticate in its messages

    @property
    def metrics_family(self) -> str:
        return self.metrics or self.family

    @property
    def error_family(self) -> str:
        """Whose error shape it answers with: Ollama's, Anthropic's, else OpenAI's (api/errors.py)."""
        return self.family if self.family in ("ollama", "anthropic") else "openai"

    @property
    def methods(self) -> dict[str, str]:
        """HTTP method (lower case) -> its success answer, for each method served."""
        answers = {"get": self.get, "head": self.head, "post": self.post, "delete": self.delete}
        return {method: answer for method, answer in answers.items() if answer is not None}

    @property
    def model_from(self) -> tuple[str, tuple[str, ...]] | None:
        """(where, field names in order) of the model the request names: ("json", ("model", "name"))."""
        if self.model_field is None:
            return None
        where, _, fields = self.model_field.partition(":")
        return where, tuple(fields.split("|"))

    def full_paths(self) -> list[str]:
        """Every path it is served at."""
        bases = (list(PREFIXES) if "api" in self.mounts else []) + ([""] if "root" in self.mounts else []) \
            + ([OLLAMA_PREFIX] if "ollama" in self.mounts else [])
        return [base + self.path for base in bases]


_R = RouteInfo
_MODEL = "json:model"
_MODEL_NAME = "json:model_name|model"  # Lemonade's management routes take `model` too
_FORM_MODEL = "form:model"
_PATH_MODEL = "path:model_id"
_OLLAMA_NAMED = "json:model|name"

ROUTES: tuple[RouteInfo, ...] = (
    # ----- inference (OpenAI) ----------------------------------------------------------------------------
    _R("/chat/completions", "openai", post="ChatCompletion", span=("LLM", "chat.completions"), streams=True,
      model_field=_MODEL),
    _R("/completions", "openai", post="Completion", span=("LLM", "completions"), streams=True, model_field=_MODEL),
    _R("/responses", "openai", post="Response", span=("LLM", "responses"), streams=True, model_field=_MODEL),
    _R("/embeddings", "openai", post="Embeddings", span=("EMBEDDING", "embeddings"), model_field=_MODEL),
    _R("/audio/transcriptions", "openai", post="TRANSCRIPTION", model_field=_FORM_MODEL),
    _R("/audio/speech", "openai", post=OWN, model_field=_MODEL),
    _R("/realtime", "openai", ROOT_AND_API, websocket=True, model_field="query:model"),
    _R("/images/generations", "openai", post="Images", model_field=_MODEL),
    _R("/images/edits", "openai", post="Images", model_field=_FORM_MODEL),
    _R("/images/variations", "openai", post="Images", model_field=_FORM_MODEL),
    _R("/images/upscale", "openai", post="Images", model_field=_MODEL),
    _R("/models", "openai", get="ModelList"),
    _R("/models/{model_id}", "openai", get="Model", model_field=_PATH_MODEL),
    # ----- Anthropic -----------------------------------------------------------------------------------
    _R("/messages", "anthropic", post="AnthropicMessage", streams=True, model_field=_MODEL),
    _R("/messages/count_tokens", "anthropic", post="TokenCount", model_field=_MODEL),
    # ----- llama.cpp -----------------------------------------------------------------------------------
    _R("/rerank", "llamacpp", post="Reranked", span=("RERANKER", "reranking"), model_field=_MODEL),
    _R("/reranking", "llamacpp", post="Reranked", span=("RERANKER", "reranking"), model_field=_MODEL),
    _R("/reranker", "llamacpp", post="Reranked", span=("RERANKER", "reranking"), model_field=_MODEL),
    _R("/tokenize", "llamacpp", post="Tokens", model_field=_MODEL),  # none named: the most recent model
    _R("/slots", "llamacpp", get="SLOT_LIST"),
    _R("/slots/{slot_id}", "llamacpp", post="SlotAction"),
    _R("/systemone", "llamacpp", post="SystemOneAnswers", metrics="lemonade", model_field=_MODEL),
    # ----- Lemonade: status ----------------------------------------------------------------------------
    _R("/health", "lemonade", get="Health"),
    _R("/stats", "lemonade", get="Stats"),
    _R("/system-stats", "lemonade", get="SystemStats"),
    _R("/system-info", "lemonade", get="SystemInfo"),
    _R("/logs/stream", "lemonade", ROOT_AND_API, websocket=True),
    _R("/spans/stream", "lemonade", ROOT_AND_API, websocket=True, auth_in_messages=True),
    _R("/traces/stream", "lemonade", ROOT_AND_API, websocket=True, auth_in_messages=True),
    # ----- Lemonade: models, residency, downloads, backends ----------------------------------------------
    # Counted as OpenAI's in /metrics, with the rest of /models.
    _R("/models/register", "lemonade", post="Registered", metrics="openai", model_field="json:model_name"),
    _R("/models/check-updates", "lemonade", post="Updates", metrics="openai"),
    _R("/models/{model_id}/options", "lemonade", get="OptionsView", post="OptionsView", delete="OptionsView",
      metrics="openai", model_field=_PATH_MODEL),
    _R("/models/{model_id}/files", "lemonade", get="ModelFiles", metrics="openai", model_field=_PATH_MODEL),
    _R("/load", "lemonade", post="Status", streams=True, model_field=_MODEL_NAME),
    _R("/unload", "lemonade", post="Status", model_field=_MODEL_NAME),  # none named: every loaded model
    _R("/pull", "lemonade", post="Registered", streams=True, plain_error=True, model_field=_MODEL_NAME),
    _R("/pull/variants", "lemonade", get="Variants", plain_error=True),
    _R("/delete", "lemonade", post="Status", model_field=_MODEL_NAME),
    _R("/downloads", "lemonade", get="DOWNLOAD_JOBS"),
    _R("/downloads/control", "lemonade", post="Status"),
    _R("/registry/search", "lemonade", get="SearchResults"),
    _R("/install", "lemonade", post="Installed", streams=True),
    _R("/uninstall", "lemonade", post="Installed"),
    _R("/cloud/auth", "lemonade", post="CloudKeySet"),
    _R("/cloud/auth/{provider}", "lemonade", delete="CloudKeyCleared"),
    _R("/params", "lemonade", get="SERVER_SETTINGS", post="Status", plain_error=True),
    _R("/routing/validate", "lemonade", post="RoutingValidation", plain_error=True),
    _R("/classify", "lemonade", post="Classified", span=("CLASSIFIER", "classify"), model_field=_MODEL),
    # ----- Lemonade: jobs ------------------------------------------------------------------------------
    _R("/jobs", "lemonade", get="JobList", post=OWN, plain_error=True),
    _R("/jobs/{job_id}", "lemonade", get="JobRecord", delete="JobDeleted"),
    _R("/jobs/{job_id}/events", "lemonade", get=OWN),
    _R("/jobs/{job_id}/pause", "lemonade", post="JobAction"),
    _R("/jobs/{job_id}/interrupt", "lemonade", post="JobAction"),
    _R("/jobs/{job_id}/resume", "lemonade", post="JobAction"),
    # ----- the root: status, the web app, FastAPI's documents ---------------------------------------------
    _R("/live", "lemonade", ROOT, get="Live", head=EMPTY, metrics="live", open=True),
    _R("/metrics", "lemonade", ROOT, get="PROMETHEUS_TEXT", head="PROMETHEUS_TEXT", metrics="metrics"),
    _R("/", "lemonade", ROOT, get="WEB_PAGE", head="WEB_PAGE", open=True),
    _R("/renderer.bundle.js", "lemonade", ROOT, get=OWN, open=True),
    _R("/static/{path:path}", "lemonade", ROOT, get=OWN, head=OWN, open=True),
    _R("/web-app", "lemonade", ROOT, get=OWN, open=True),
    _R("/web-app/{relative:path}", "lemonade", ROOT, get=OWN, open=True),
    _R("/favicon.ico", "lemonade", ROOT, open=True),  # not served: a browser's own request gets a 404, not a 401
    _R("/openapi.json", "lemonade", ROOT, get=OWN, head=OWN, open=True),
    _R("/docs", "lemonade", ROOT, get=OWN, head=OWN, open=True),
    _R("/docs/oauth2-redirect", "lemonade", ROOT, get=OWN, head=OWN),
    _R("/redoc", "lemonade", ROOT, get=OWN, head=OWN, open=True),
    # ----- MCP -----------------------------------------------------------------------------------------
    _R("/mcp", "mcp", ROOT, post="JsonRpcReply", get=OWN, delete=OWN),
    # ----- internal (the admin key) --------------------------------------------------------------------
    _R("/internal/config", "internal", ROOT, get="SERVER_SETTINGS"),
    _R("/internal/set", "internal", ROOT, post="Status"),
    _R("/internal/pin", "internal", ROOT, post="Pinned", model_field="json:model|model_name"),
    _R("/internal/simulate-vram-pressure", "internal", ROOT, post="PRESSURE_SIMULATED"),
    _R("/internal/aliases", "internal", ROOT, get="Aliases", post="Alias", model_field="json:target|model"),
    _R("/internal/aliases/{alias}", "internal", ROOT, delete="Alias"),
    _R("/internal/telemetry/flush", "internal", ROOT, post="Flushed"),
    _R("/internal/shutdown", "internal", ROOT, post="ShuttingDown"),
    _R("/internal/mcp/servers", "internal", ROOT, get="MCP_SERVERS", post="MCP_SERVER"),
    _R("/internal/mcp/servers/{server_id}", "internal", ROOT, delete="MCP_SERVER_REMOVED"),
    _R("/internal/mcp/servers/{server_id}/connect", "internal", ROOT, post="MCP_SERVER"),
    _R("/internal/mcp/servers/{server_id}/disconnect", "internal", ROOT, post="MCP_SERVER"),
    _R("/internal/mcp/servers/{server_id}/refresh-tools", "internal", ROOT, post="MCP_SERVER"),
    _R("/internal/mcp/servers/{server_id}/tools/call", "internal", ROOT, post="MCP_TOOL_RESULT"),
    _R("/internal/mcp/tools", "internal", ROOT, get="MCP_TOOLS"),
    # ----- peers: other servers of the LAN (api/peers.py); the peer key guards them, not the API key ----
    _R("/peers/challenge", "lemonade", ROOT, post="PEER_CHALLENGE", open=True),
    _R("/peers/session", "lemonade", ROOT, post="PEER_SESSION", open=True),
    _R("/peers/models", "lemonade", ROOT, get="PEER_MODELS", open=True),
    # ----- Ollama (under /api) -------------------------------------------------------------------------
    _R("/chat", "ollama", OLLAMA, post="OllamaChat", streams=True, model_field=_MODEL),
    _R("/generate", "ollama", OLLAMA, post="OllamaGenerate", streams=True, model_field=_MODEL),
    _R("/embed", "ollama", OLLAMA, post="OllamaEmbed", model_field=_MODEL),
    _R("/embeddings", "ollama", OLLAMA, post="OllamaEmbedding", model_field=_MODEL),
    _R("/tags", "ollama", OLLAMA, get="OllamaModels"),
    _R("/ps", "ollama", OLLAMA, get="OllamaModels"),
    _R("/show", "ollama", OLLAMA, post="OllamaShow", model_field=_OLLAMA_NAMED),
    _R("/version", "ollama", OLLAMA, get="OllamaVersion"),
    _R("/delete", "ollama", OLLAMA, delete=EMPTY, model_field=_OLLAMA_NAMED),
    _R("/pull", "ollama", OLLAMA, post="OllamaStatus", streams=True, model_field=_OLLAMA_NAMED),
    _R("/create", "ollama", OLLAMA, post=REFUSED),
    _R("/copy", "ollama", OLLAMA, post=REFUSED),
    _R("/push", "ollama", OLLAMA, post=REFUSED),
    _R("/blobs/{digest}", "ollama", OLLAMA, post=REFUSED, head=REFUSED),
)


def _pattern(path: str) -> re.Pattern[str]:
    """A path template as Starlette matches it: `{name}` one segment, `{name:path}` the rest."""
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile("".join(
        (".*" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts))


def _fixed_paths() -> dict[tuple[str, str], RouteInfo]:
    """(mount, path) -> route, for the routes without a parameter."""
    fixed: dict[tuple[str, str], RouteInfo] = {}
    for route in ROUTES:
        if route.family not in FAMILIES:
            raise ValueError(f"{route.path}: unknown API family {route.family!r}")
        if "{" in route.path:
            continue
        for mount in route.mounts:
            if (mount, route.path) in fixed:
                raise ValueError(f"{route.path} is in the route table twice")
            fixed[(mount, route.path)] = route
    return fixed


@functools.cache
def _templates(mount: str) -> list[tuple[re.Pattern[str], RouteInfo]]:
    """The routes with a parameter served at `mount`, compiled when first asked for (the CLI, which
    reads PREFIXES only, never pays for it)."""
    return [(_pattern(route.path), route) for route in ROUTES if mount in route.mounts and "{" in route.path]


_FIXED = _fixed_paths()
_SLASHED = tuple((prefix + "/", len(prefix)) for prefix in PREFIXES)


def split(path: str) -> tuple[str, str]:
    """(mount, the path after its prefix): ("api", "/chat/completions") for `/v1/chat/completions`,
    ("ollama", "/chat") for `/api/chat`, ("root", path) for anything else."""
    for slashed, length in _SLASHED:
        if path.startswith(slashed):
            return "api", path[length:]
    if path.startswith(OLLAMA_PREFIX + "/"):
        return "ollama", path[len(OLLAMA_PREFIX):]
    return "root", path


def route_of(path: str) -> RouteInfo | None:
    """The route a request path is answered by (any prefix stripped), or None when none serves it.

    A fixed path is one dict lookup (the hot inference routes); only a path no fixed route has is
    tried against the templates (`/models/{model_id}`)."""
    mount, rest = split(path)
    route = _FIXED.get((mount, rest))
    if route is None:
        for pattern, candidate in _templates(mount):
            if pattern.fullmatch(rest):
                return candidate
    return route
