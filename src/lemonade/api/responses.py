"""What each operation answers on success, for `/openapi.json` only.

Routes return plain dicts (or relay an engine's JSON) on purpose: validating every answer through
a pydantic `response_model` would cost time on the request path (docs/performance.md) and would
drop fields engines add. These models only *document* the answers: each route's row in
route_table.py names its answer per method (a model or a schema below, by its name here), and
`api/openapi.py` attaches it to the operation. Every model allows extra fields: the fields named
are the ones the spec documents and the server always sends, so a client can rely on them and a
fuzzer checks them (`benchmarks/fuzz_api.py`, `tests/test_fuzz.py`).
`tests/test_foundation.py` checks that no JSON operation is left without one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lemonade.api.lemonade.job_protocol import (  # noqa: F401 - the route table names the Job Engine's here
    JobAction,
    JobDeleted,
    JobList,
    JobRecord,
)

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
    """A JSON answer: an object with these fields."""
    return {"application/json": {"type": "object", "required": list(required), "properties": required}}


# Answers that are a schema per media type rather than one model.
WEB_PAGE = {"text/plain": TEXT, "text/html": TEXT}  # the web app to a browser or */*; Ollama's line
PROMETHEUS_TEXT = {"text/plain": TEXT}
TRANSCRIPTION = {"application/json": Transcription.model_json_schema(), "text/plain": TEXT}
DOWNLOAD_JOBS = {"application/json": {"type": "array", "items": DownloadJob.model_json_schema()}}
SLOT_LIST = {"application/json": {"type": "array", "items": {"type": "object"}}}
SERVER_SETTINGS = _object_of({"port": {"type": "integer"}, "host": {"type": "string"}})
PRESSURE_SIMULATED = _object_of({"status": {"const": "ok"}})
MCP_SERVERS = _object_of({"servers": {"type": "array", "items": {"type": "object"}}})
MCP_SERVER = _object_of({"server": {"type": "object"}})
MCP_SERVER_REMOVED = _object_of({"removed": {"type": "string"}})
MCP_TOOL_RESULT = _object_of({"server_id": {"type": "string"}, "tool": {"type": "string"},
                              "result": {"type": "object"}})
MCP_TOOLS = _object_of({"tools": {"type": "array", "items": {"type": "object"}}})
PEER_CHALLENGE = _object_of({"server_nonce": {"type": "string"}, "address": {"type": "string"},
                             "proof": {"type": "string"}, "instance": {"type": "string"}})
PEER_SESSION = _object_of({"expires_in": {"type": "number"}, "instance": {"type": "string"},
                           "hostname": {"type": "string"}})
PEER_MODELS = _object_of({"instance": {"type": "string"}, "hostname": {"type": "string"},
                          "data": {"type": "array", "items": {"type": "object"}},
                          "loaded": {"type": "array", "items": {"type": "string"}}})
Answer = type[BaseModel] | dict[str, dict[str, Any]] | None  # None: an empty body
