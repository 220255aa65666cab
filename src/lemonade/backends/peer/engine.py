"""The peer engine: a model served by another Lemonade server of the LAN (backends/peer/peers.py).

A remote engine, as the cloud engine is: "loading" a peer's model binds it to that peer
(`PeerConnection`), starts no process, takes no slot and evicts nothing; every request leaves
through `outbound` for the peer's own public API (the same path, the model named as the peer knows
it, the session token of backends/peer/auth.py in the `X-Lemonade-Peer` header), so chat, completions,
responses, embeddings, rerank, tokenize, transcription, speech and pictures all go the way they
would go to that server directly, streams included, and every API family (OpenAI, Ollama,
Anthropic, MCP) reaches it through the same router and proxy as a local engine. A peer that does
not answer, or no longer admits our session, is reported as `peer_unreachable` /
`peer_unavailable`: the proxy then asks the next peer or this server's own model
(runtime/forwarding.py `instead`).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from lemonade.backends.engine import BackendState, EngineUnavailable, InstallError, Launch, Progress
from lemonade.backends.image_engine import ImageEngine
from lemonade.backends.peer.auth import HEADER
from lemonade.backends.peer.peers import CONNECT_SECONDS, RECIPE, Peers, label
from lemonade.backends.speech_engine import ENCODED_FORMATS, SpeechService
from lemonade.backends.whispercpp.engine import multipart_frame

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

TRANSCRIPTIONS = "/v1/audio/transcriptions"
SPEECH = "/v1/audio/speech"
EDITS = "/v1/images/edits"
# Errors after which a request is better asked elsewhere: nothing reached the client yet, and the peer
# either did not answer or does not (any longer) take our session.
FAILOVER_CODES = ("peer_unreachable", "peer_unavailable")
# Pictures: their body is made by the engine description (sd-server takes its options in the prompt),
# so a picture a peer failed to make is not asked of another kind of engine in the same request.
ENGINE_MADE = ("images/generations", "images/edits")
# Endpoints (as `check_model` of serving/models.py names them) never forwarded: count_tokens applies the model's
# template through llama-server's own routes, which a peer's public API does not offer.
LOCAL_ONLY_ENDPOINTS = ("/messages/count_tokens",)


class PeerConnection:
    """What a bound peer model is: the parts of `WrappedServer` the router reads, no process."""

    pid = None
    proc = None
    argv: list[str] = []
    alive = True
    on_exit = None

    def __init__(self, url: str, upstream_id: str) -> None:
        self.url = url
        self.upstream_id = upstream_id
        self.base_url = url  # health shows `base_url + "/v1"`: the peer's own API

    async def stop(self, grace: float = 0.0) -> None:
        return None

    def kill_now(self, report: bool = False) -> None:
        return None

    def __repr__(self) -> str:
        return f"PeerConnection({self.url}, {self.upstream_id})"


class PeerEngine(ImageEngine, SpeechService):
    """Every mode a peer serves; what a mode needs checked (speech formats, picture sizes, audio
    containers) the peer checks itself and its refusal reaches the client as it said it."""

    recipe = RECIPE
    remote = True
    process = "peer"
    connect_timeout = CONNECT_SECONDS
    lean_client = True  # another of our servers: plain HTTP/1.1 that runtime/engine_client.py speaks
    endpoints = {"chat/completions": "/v1/chat/completions", "completions": "/v1/completions",
                 "responses": "/v1/responses", "embeddings": "/v1/embeddings", "rerank": "/v1/rerank",
                 "tokenize": "/v1/tokenize", "classify": "/v1/classify", "audio/transcriptions": TRANSCRIPTIONS,
                 "audio/speech": SPEECH, "images/generations": "/v1/images/generations", "images/edits": EDITS}
    # what the peer's engine decodes and encodes is the peer's to say: nothing is refused here first
    audio_formats = ("wav", "mp3", "flac", "ogg", "webm")
    speech_formats = ENCODED_FORMATS
    stream_formats = ("pcm",)
    speed_range = (0.25, 4.0)

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.peers = Peers(config)

    @classmethod
    def endpoint_of(cls, path: str) -> str | None:
        """Our endpoint whose request went to a peer at `path`, where every engine takes that request
        alike (so another engine may be asked it instead); None otherwise."""
        for endpoint, peer_path in cls.endpoints.items():
            if peer_path == path:
                return None if endpoint in ENGINE_MADE else endpoint
        return None

    def state(self, backend: str) -> BackendState:
        up = [p for p in self.peers.peers() if p.up]
        message = (f"{len(up)} peer(s) answering" if self.peers.forwarding else
                   "forwarding to the other servers of the LAN is off: set config 'peers' and LEMONADE_PEER_KEY")
        return BackendState(self.recipe, backend, "installed", message=message)

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        raise InstallError("Peers are other Lemonade servers: name them with config 'peers' (a list of URLs, or "
                           "\"auto\") and give every member the same LEMONADE_PEER_KEY", code="missing_argument")

    def uninstall(self, backend: str) -> dict[str, Any]:
        raise InstallError("Peers are removed from config 'peers' (lemonade config set peers=[])",
                           code="missing_argument")

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        url = model.definition.get("peer")
        if not url:
            raise EngineUnavailable(f"Model {model.public}: recipe '{self.recipe}' names the models of the LAN's "
                                    "peers as this server finds them; it cannot be registered", code="model_load_error")
        return Launch(PeerConnection(url, model.definition["upstream_id"]), dict(options),  # type: ignore[arg-type]
                      backend, device=f"peer {label(url)}")

    async def health_fields(self, loaded: dict[str, dict[str, Any]]) -> dict[str, Any]:
        if not self.peers.setting() and not self.peers.gate.open:
            return {}
        return {"peers": self.peers.describe()}

    # ----- requests ------------------------------------------------------------------------------------
    def outbound(self, launch: Launch, path: str, body: dict[str, Any] | None,
                 headers: dict[str, str]) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
        conn: PeerConnection = launch.server  # type: ignore[assignment]
        peer = self.peers.get(conn.url)
        # no session (the peer went down meanwhile): it answers 401, which fails over like silence
        headers = {**headers, HEADER: (peer.token if peer is not None else None) or "none"}
        if body is not None:
            body = {**body, "model": conn.upstream_id}
            if path == SPEECH and body.pop("stream", False):  # our speech worker's flag, the public API's field
                body["stream_format"] = "audio"
        return conn.url + path, body, headers

    def encode_raw(self, path: str, content_type: str, launch: Launch | None = None) -> tuple[str, bytes, bytes, str]:
        """A transcription (the audio as the body, fields in the query) as the peer's multipart form,
        answered as verbose_json (our engines' result); a picture edit (a multipart body of ours)
        gets the model as one more part in front."""
        conn: PeerConnection = launch.server  # type: ignore[union-attr, assignment]
        url = urlsplit(path)
        if url.path == TRANSCRIPTIONS:
            fields = {"model": conn.upstream_id, **dict(parse_qsl(url.query)), "response_format": "verbose_json"}
            head, tail, multipart_type = multipart_frame(fields)
            return TRANSCRIPTIONS, head, tail, multipart_type
        boundary = content_type.partition("boundary=")[2].strip('"')
        if url.path == EDITS and boundary:
            part = f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{conn.upstream_id}\r\n'
            return path, part.encode(), b"", content_type
        return path, b"", b"", content_type

    def generation_body(self, prompt: str, width: int, height: int, steps: int | None, cfg_scale: float | None,
                        seed: int) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": prompt, "n": 1, "size": f"{width}x{height}", "seed": seed,
                                "response_format": "b64_json"}
        if steps is not None:
            body["steps"] = steps
        if cfg_scale is not None:
            body["cfg_scale"] = cfg_scale
        return body

    def edit_body(self, prompt: str, images: list[bytes], mask: bytes | None, width: int, height: int,
                  steps: int | None, cfg_scale: float | None, seed: int) -> tuple[bytes, str]:
        boundary = f"lemonade-{uuid.uuid4().hex}"
        fields = {"prompt": prompt, "size": f"{width}x{height}", "n": "1", "seed": str(seed),
                  "response_format": "b64_json"}
        if steps is not None:
            fields["steps"] = str(steps)
        if cfg_scale is not None:
            fields["cfg_scale"] = str(cfg_scale)
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                 for k, v in fields.items()]
        files = [("image", image) for image in images] + ([("mask", mask)] if mask is not None else [])
        parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.png"\r\n'
                  "Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n" for name, data in files]
        return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"

    def upstream_error(self, launch: Launch, status: int, message: str) -> tuple[int, str, str] | None:
        conn: PeerConnection = launch.server  # type: ignore[assignment]
        if status == 401:
            self.peers.failed(conn.url, "it did not admit our session")
            return 502, f"Peer {conn.url} did not admit this server's session: {message}", "peer_unavailable"
        return None  # the peer's own answer (a 400 naming a field, a 404, ...), as it said it

    def unreachable(self, launch: Launch, exc: BaseException) -> tuple[int, str, str]:
        conn: PeerConnection = launch.server  # type: ignore[assignment]
        cause = exc.__cause__ or exc
        reason = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        self.peers.failed(conn.url, f"a forwarded request found it not answering ({reason})")
        return 502, (f"Peer {conn.url} did not answer ({reason}); it is skipped until it answers again"), \
            "peer_unreachable"
