"""What each operation answers on success, for `/openapi.json` only.

Routes return plain dicts (or relay an engine's JSON) on purpose: validating every answer through
a pydantic `response_model` would cost time on the request path (docs/performance.md) and would
drop fields engines add. These models only *document* the answers: `api/openapi.py` attaches them
to the operations listed in `SUCCESS`, keyed by method and path after the prefix. Every model allows
extra fields: the fields named are the ones the spec documents and the server always sends, so a
client can rely on them and a fuzzer checks them (`benchmarks/fuzz_api.py`, `tests/test_fuzz.py`).
`tests/test_foundation.py` checks that no JSON operation is left without one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.lemonade.job_protocol import JOB_ANSWERS

Number = int | float


class Doc(BaseModel):
    """A documented answer: named fields are always there; others may follow."""

    model_config = ConfigDict(extra="allow")


# ----- status -----------------------------------------------------------------------------------------
class Live(Doc):
    status: Literal["ok"]


class LoadedModel(Doc):
    model_name: str
    checkpoint: str | None = None
    type: str
    recipe: str
    device: str
    pinned: bool
    residency_class: Literal["standard", "routing_helper"]
    slot_pool: str
    is_busy: bool
    backend_url: str
    recipe_options: dict[str, Any]
    launch_command: list[str]


class Health(Doc):
    status: Literal["ok"]
    version: str
    model_loaded: str | None
    all_models_loaded: list[LoadedModel]
    max_models: dict[str, int]
    pinned_models: dict[str, int]
    pinned_helper_models: dict[str, int]
    queue: dict[str, Any]
    websocket_port: int | None = None


class Stats(Doc):
    time_to_first_token: Number | None
    tokens_per_second: Number | None
    input_tokens: int | None
    output_tokens: int | None
    draft_tokens: int | None  # speculative decoding's draft tokens in the last answer (None: it drafted none)
    draft_accepted_tokens: int | None
    draft_acceptance_rate: Number | None
    speculative_speedup: Number | None  # measured against the model's speed without speculation
    speculation: dict[str, dict[str, Any]]  # per model: what speculation earns it (runtime/speculation.py)


class SystemStats(Doc):
    cpu_percent: Number | None
    memory_gb: Number | None
    gpu_percent: Number | None
    vram_gb: Number | None
    npu_percent: Number | None


class SystemInfo(Doc):
    devices: dict[str, Any]
    recipes: dict[str, Any]


# ----- models and their management ---------------------------------------------------------------
class Model(Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    recipe: str | None = None
    downloaded: bool | None = None
    labels: list[str] = []


class ModelList(Doc):
    object: Literal["list"]
    data: list[Model]


class Status(Doc):
    """The `{"status": "success", "message": ...}` answer of Lemonade's management routes."""

    status: str
    message: str | None = None


class Registered(Status):
    model_name: str


class Installed(Status):
    recipe: str | None = None  # absent for a cloud provider (backend "cloud"), named by `provider`
    backend: str
    provider: str | None = None


class OptionsView(Doc):
    model_name: str
    recipe: str
    saved: dict[str, Any]
    effective: dict[str, Any]
    defaults: dict[str, Any]
    layers: dict[str, list[str]]  # where each effective value came from (runtime/options.py LAYERS)
    architecture: str | None  # the GGUF architecture of the model's file; null before the download
    architecture_defaults: dict[str, Any]


class ModelFiles(Doc):
    model_id: str
    files: list[dict[str, Any]]


class Updates(Status):
    updates_available: int
    models: list[dict[str, Any]]


class SearchResult(Doc):
    repository_id: str
    source: str


class SearchResults(Doc):
    source: str
    query: str
    total: int
    results: list[SearchResult]


class Variants(Doc):
    checkpoint: str
    variants: list[dict[str, Any]]


class RoutingValidation(Doc):
    decision: dict[str, Any] = Field(description="The rule matched, the model chosen and the trace")
    normalized_policy: dict[str, Any] = Field(description="The policy with `routing` as evaluated")


class DownloadJob(Doc):
    id: str
    model_name: str
    status: str
    running: bool


class Pinned(Status):
    model_name: str
    pinned: bool


class Alias(Doc):
    alias: str
    target: str


class Aliases(Doc):
    aliases: list[Alias]


# ----- inference (OpenAI) -------------------------------------------------------------------------
class AssistantMessage(Doc):
    role: str
    content: str | None = None


class ChatChoice(Doc):
    index: int
    message: AssistantMessage
    finish_reason: str | None


class ChatCompletion(Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]


class CompletionChoice(Doc):
    index: int
    text: str
    finish_reason: str | None


class Completion(Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]


class Embedding(Doc):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: base64 with encoding_format=base64


class Embeddings(Doc):
    object: Literal["list"]
    data: list[Embedding]
    model: str


class Response(Doc):
    id: str
    object: Literal["response"]
    status: str
    output: list[dict[str, Any]]


class Transcription(Doc):
    text: str


class ImageData(Doc):
    b64_json: str = Field(..., description="A base64-encoded PNG")


class Images(Doc):
    created: int
    data: list[ImageData]


class RerankResult(Doc):
    index: int
    relevance_score: float


class Reranked(Doc):
    model: str
    results: list[RerankResult]


class ClassifiedText(Doc):
    object: Literal["classification"]
    index: int
    labels: dict[str, Number]


class Classified(Doc):
    """`/classify`: one text's `labels` (label -> score in [0, 1], highest first), or a list's `data`."""

    object: Literal["classification", "list"]
    model: str
    labels: dict[str, Number] | None = Field(None, description="The text's scores (a single `input`)")
    data: list[ClassifiedText] | None = Field(None, description="One entry per text (a list `input`)")


class SystemOneAnswers(Doc):
    model: str
    answers: dict[str, dict[str, Any]]
    usage: dict[str, Any] | None = None


class Tokens(Doc):
    tokens: list[int | dict[str, Any]]


class SlotAction(Doc):
    id_slot: int | None = None


# ----- Anthropic ----------------------------------------------------------------------------------
class AnthropicMessage(Doc):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[dict[str, Any]]
    model: str
    stop_reason: str | None
    usage: dict[str, Any]


class TokenCount(Doc):
    input_tokens: int


# ----- Ollama ------------------------------------------------------------------------------------
class OllamaModel(Doc):
    name: str
    model: str
    size: int
    digest: str
    details: dict[str, Any]


class OllamaModels(Doc):
    models: list[OllamaModel]


class OllamaShow(Doc):
    modelfile: str
    parameters: str
    template: str
    details: dict[str, Any]
    model_info: dict[str, Any]
    capabilities: list[str]


class OllamaVersion(Doc):
    version: str


class OllamaChat(Doc):
    model: str
    created_at: str
    message: dict[str, Any]
    done: bool


class OllamaGenerate(Doc):
    model: str
    created_at: str
    response: str
    done: bool


class OllamaEmbed(Doc):
    model: str
    embeddings: list[list[float]]


class OllamaEmbedding(Doc):
    embedding: list[float]


class OllamaStatus(Doc):
    status: str


class Flushed(Doc):
    status: Literal["flushed"]


class ShuttingDown(Doc):
    status: Literal["shutting down"]


# ----- cloud providers ---------------------------------------------------------------------------
class AuthState(Doc):
    env_var_set: bool
    runtime_key_set: bool


class CloudKeySet(Doc):
    provider: str
    auth_state: AuthState
    models_discovered: int


class CloudKeyCleared(Doc):
    provider: str
    cleared_runtime_key: bool
    auth_state: AuthState


# ----- MCP ---------------------------------------------------------------------------------------
class JsonRpcReply(Doc):
    jsonrpc: Literal["2.0"]
    id: str | int | None
    result: dict[str, Any] | None = Field(None, description="Present on success")
    error: dict[str, Any] | None = Field(None, description="Present on failure: code and message")


TEXT = {"type": "string"}  # text/plain answers


def _object_of(required: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A JSON answer: an object with these fields (the MCP client host's, mcp_client/host.py)."""
    return {"application/json": {"type": "object", "required": list(required), "properties": required}}


_MCP_SERVER = _object_of({"server": {"type": "object"}})
Answer = type[BaseModel] | dict[str, dict[str, Any]] | None  # None: an empty body
# (method, path after the prefix) -> the model of its 200 JSON answer, a schema per media type, or
# None for an empty body. Lemonade's, OpenAI's, Anthropic's and llama.cpp's routes share this table.
SUCCESS: dict[tuple[str, str], Answer] = {
    ("get", "/live"): Live,
    ("head", "/live"): None,
    ("get", "/"): {"text/plain": TEXT, "text/html": TEXT},  # the web app to a browser or */*; Ollama's line
    ("head", "/"): {"text/plain": TEXT, "text/html": TEXT},
    ("get", "/metrics"): {"text/plain": TEXT},
    ("head", "/metrics"): {"text/plain": TEXT},
    ("get", "/health"): Health,
    ("get", "/stats"): Stats,
    ("get", "/system-stats"): SystemStats,
    ("get", "/system-info"): SystemInfo,
    ("get", "/models"): ModelList,
    ("get", "/models/{model_id}"): Model,
    ("post", "/models/register"): Registered,
    ("get", "/models/{model_id}/options"): OptionsView,
    ("post", "/models/{model_id}/options"): OptionsView,
    ("delete", "/models/{model_id}/options"): OptionsView,
    ("get", "/models/{model_id}/files"): ModelFiles,
    ("post", "/models/check-updates"): Updates,
    ("post", "/load"): Status,
    ("post", "/unload"): Status,
    ("post", "/install"): Installed,
    ("post", "/uninstall"): Installed,
    ("post", "/pull"): Registered,
    ("post", "/delete"): Status,
    ("get", "/downloads"): {"application/json": {"type": "array", "items": DownloadJob.model_json_schema()}},
    ("post", "/downloads/control"): Status,  # the job as it is now, or {"status": "ok"} once removed
    ("get", "/registry/search"): SearchResults,
    ("get", "/pull/variants"): Variants,
    ("post", "/routing/validate"): RoutingValidation,
    ("post", "/chat/completions"): ChatCompletion,
    ("post", "/completions"): Completion,
    ("post", "/embeddings"): Embeddings,
    ("post", "/responses"): Response,
    ("post", "/audio/transcriptions"): {"application/json": Transcription.model_json_schema(),
                                        "text/plain": TEXT},
    ("post", "/images/generations"): Images,
    ("post", "/images/edits"): Images,
    ("post", "/images/variations"): Images,
    ("post", "/images/upscale"): Images,
    ("post", "/rerank"): Reranked,
    ("post", "/reranking"): Reranked,
    ("post", "/reranker"): Reranked,
    ("post", "/tokenize"): Tokens,
    ("post", "/classify"): Classified,
    ("post", "/systemone"): SystemOneAnswers,
    ("get", "/slots"): {"application/json": {"type": "array", "items": {"type": "object"}}},
    ("post", "/slots/{slot_id}"): SlotAction,
    ("post", "/messages"): AnthropicMessage,
    ("post", "/messages/count_tokens"): TokenCount,
    ("get", "/internal/config"): {"application/json": {"type": "object", "required": ["port", "host"],
                                                       "properties": {"port": {"type": "integer"},
                                                                      "host": {"type": "string"}}}},
    ("post", "/internal/set"): Status,
    ("get", "/params"): {"application/json": {"type": "object", "required": ["port", "host"],
                                              "properties": {"port": {"type": "integer"},
                                                             "host": {"type": "string"}}}},
    ("post", "/params"): Status,
    ("post", "/internal/pin"): Pinned,
    ("post", "/internal/simulate-vram-pressure"): {"application/json": {
        "type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}},
    ("get", "/internal/aliases"): Aliases,
    ("post", "/internal/aliases"): Alias,
    ("delete", "/internal/aliases/{alias}"): Alias,
    ("post", "/mcp"): JsonRpcReply,
    ("post", "/internal/telemetry/flush"): Flushed,
    ("post", "/internal/shutdown"): ShuttingDown,
    ("get", "/internal/mcp/servers"): _object_of({"servers": {"type": "array", "items": {"type": "object"}}}),
    ("post", "/internal/mcp/servers"): _MCP_SERVER,
    ("delete", "/internal/mcp/servers/{server_id}"): _object_of({"removed": {"type": "string"}}),
    ("post", "/internal/mcp/servers/{server_id}/connect"): _MCP_SERVER,
    ("post", "/internal/mcp/servers/{server_id}/disconnect"): _MCP_SERVER,
    ("post", "/internal/mcp/servers/{server_id}/refresh-tools"): _MCP_SERVER,
    ("post", "/internal/mcp/servers/{server_id}/tools/call"): _object_of({
        "server_id": {"type": "string"}, "tool": {"type": "string"}, "result": {"type": "object"}}),
    ("get", "/internal/mcp/tools"): _object_of({"tools": {"type": "array", "items": {"type": "object"}}}),
    # the peer handshake and listing (api/peers.py)
    ("post", "/peers/challenge"): _object_of({"server_nonce": {"type": "string"}, "address": {"type": "string"},
                                              "proof": {"type": "string"}, "instance": {"type": "string"}}),
    ("post", "/peers/session"): _object_of({"expires_in": {"type": "number"}, "instance": {"type": "string"},
                                            "hostname": {"type": "string"}}),
    ("get", "/peers/models"): _object_of({"instance": {"type": "string"}, "hostname": {"type": "string"},
                                          "data": {"type": "array", "items": {"type": "object"}},
                                          "loaded": {"type": "array", "items": {"type": "string"}}}),
    ("post", "/cloud/auth"): CloudKeySet,
    ("delete", "/cloud/auth/{provider}"): CloudKeyCleared,
}
SUCCESS.update(JOB_ANSWERS)  # the Job Engine's (api/lemonade/job_protocol.py)
# The Ollama API (`/api/...`), whose paths after `/api` overlap the others' (`/pull`, `/embeddings`).
OLLAMA_SUCCESS: dict[tuple[str, str], Answer] = {
    ("get", "/tags"): OllamaModels,
    ("get", "/ps"): OllamaModels,
    ("post", "/show"): OllamaShow,
    ("get", "/version"): OllamaVersion,
    ("delete", "/delete"): None,
    ("post", "/chat"): OllamaChat,
    ("post", "/generate"): OllamaGenerate,
    ("post", "/embed"): OllamaEmbed,
    ("post", "/embeddings"): OllamaEmbedding,
    ("post", "/pull"): OllamaStatus,
}
# Operations that always refuse (Ollama's model creation and upload): no success answer to document.
UNSUPPORTED = {("post", "/create"), ("post", "/copy"), ("post", "/push"), ("post", "/blobs/{digest}"),
               ("head", "/blobs/{digest}")}
