"""The engine description: everything the rest of the server knows about one recipe.

Lemonade's C++ server keeps one `BackendDescriptor` per engine; this is the same idea. An `Engine`
says which deployment modes it serves, which backends it has and how each is installed, which
recipe options it takes, how a loaded model is started (`launch`), how our endpoints map to the
engine's, and how its idle memory is trimmed. The router, the options layer, `/v1/install`,
`/v1/system-info`, `/v1/health` and the CLI read these descriptions; no other module names a
recipe. A new engine is one subclass in `backends/<engine>.py`, registered in `registry.py`, and its
recipe's entry in recipes.py (the modes it serves).

Residency (LRU, pinning, busy protection, crash restart, idle eviction) is not an engine matter:
the router applies it to every engine alike.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from lemonade.backends.descriptors import BY_RECIPE

if TYPE_CHECKING:
    from lemonade.backends.base import WrappedServer
    from lemonade.config import Config
    from lemonade.errors import APIError
    from lemonade.model_info import ModelInfo

Progress = Callable[[dict[str, Any]], None] | None


class EngineHTTP(Protocol):
    """What an engine needs to talk to its own running process: the router passes its client in
    (runtime/engine_client.py `EngineClient`), so no engine knows the runtime that drives it."""

    async def request(self, method: str, base_url: str, path: str, body: bytes | None = None,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        """(status, body) of one request to the engine at `base_url`."""


class InstallError(RuntimeError):
    """An install that could not be done; the message says why and what to do next."""

    def __init__(self, message: str, code: str = "install_failed", log_path: Path | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.log_path = log_path


class EngineUnavailable(RuntimeError):
    """A load that cannot start: backend missing/unsupported. `action` is the command to run."""

    def __init__(self, message: str, code: str = "backend_not_installed", action: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.action = action


@dataclass
class BackendState:
    recipe: str
    backend: str
    state: str  # "installed" | "installable" | "update_required" | "unsupported"
    message: str = ""
    action: str = ""
    version: str | None = None
    devices: list[str] = field(default_factory=list)
    update_available: str | None = None  # a newer release `*_bin=latest` offers (backends/bin_select.py)

    def to_dict(self) -> dict[str, Any]:
        """The per-backend object of `/v1/system-info` `recipes.<recipe>.backends.<backend>`."""
        out: dict[str, Any] = {"devices": list(self.devices), "state": self.state, "message": self.message,
                               "action": self.action}
        if self.version is not None:
            out["version"] = self.version
        if self.update_available is not None:
            out["update_available"] = self.update_available
        return out


@dataclass(frozen=True)
class Option:
    """One recipe option: its JSON type, the config key the server-wide layer takes it from
    (runtime/options.py), and a check."""

    type: type | tuple[type, ...]
    config_key: str | None = None
    default: Any = None
    check: Callable[[Any], str | None] | None = None  # returns an error message, or None when fine


@dataclass(frozen=True)
class Speculation:
    """The speculative decoding a started engine runs, and who chose it."""

    kind: str | None = None  # llama.cpp's --spec-type (e.g. "ngram-map-k", "draft-mtp"); None: none
    # "auto": the server's controller may switch it (runtime/speculation.py); "on"/"off": forced by the
    # `speculation` option; "args": the user's own --spec-type in the engine's arguments.
    mode: str = "off"

    @property
    def switchable(self) -> bool:
        return self.mode == "auto"


@dataclass
class Launch:
    """A started engine process for one model, with the options as actually applied."""

    server: WrappedServer
    options: dict[str, Any]
    backend: str
    device: str = "cpu"
    # Tokens one request may use, as the running engine reports it (None: the engine does not say;
    # the options' ctx_size stands), and how the context was chosen, for the load answer.
    context_length: int | None = None
    context_reason: str = ""
    # (tokens, slots) of a KV cache that all of the engine's slots share (llama-server with a unified
    # cache and several slots): requests reserve a part of it before they are sent (runtime/kv_pool.py).
    shared_kv: tuple[int, int] | None = None
    # The engine's slots, where requests may be sent to one by id (llama-server's `id_slot`): the router
    # sends each conversation back to the slot holding it (runtime/slot_affinity.py). None: it has none.
    slots: int | None = None
    # Whether a slot's saved state, restored into another slot, gives that one every token it has in
    # common with the next prompt (llama-server keeps a prefix of it: not so for a sliding-window model
    # without its full window cache). The proxy then copies a shared prefix between slots (`share_slot`).
    prefix_copy: bool = False
    speculation: Speculation = field(default_factory=Speculation)


@dataclass(frozen=True)
class MemoryNeed:
    """The most a loaded model's processes may hold (docs/memory.md), estimated before it starts.

    `fixed` bytes, plus for an engine with a context each of `terms`: (bytes per token of context,
    at most that many tokens or None), so the cost of any context can be worked out before the
    context is chosen. `ctx`: the context it is asked for (the largest, with `ctx_size: -1`);
    `ctx_min`: with `ctx_size: -1`, the smallest context worth loading (the router picks the largest
    from `ctx_min` to `ctx` that fits the memory free). `parts` names what `fixed` is made of, for
    messages and `/v1/health`. `fallback`: what the load holds without an extra the engine may leave
    out when memory is short (llama.cpp's speculative decoding in `auto`), taken instead of evicting
    anything or refusing."""

    fixed: int
    terms: tuple[tuple[float, int | None], ...] = ()
    ctx: int | None = None
    ctx_min: int | None = None
    parts: Mapping[str, int] = field(default_factory=dict)
    fallback: MemoryNeed | None = None
    # What part of the load the figures are, for messages: "" for the whole model; a share when the
    # rest sits elsewhere (a load split over RPC workers: this host's share, llamacpp.memory.split_need).
    share: str = ""
    ALIGN: ClassVar[int] = 256  # llama.cpp sizes its KV cache in steps of 256 cells

    def at(self, ctx: int | None = None) -> int:
        """Bytes at context `ctx` (the asked one by default)."""
        n = self.ctx if ctx is None else ctx
        if not n:
            return self.fixed
        return int(self.fixed + sum(rate * (n if cap is None else min(n, cap)) for rate, cap in self.terms))

    @property
    def auto(self) -> bool:
        return self.ctx_min is not None and self.ctx is not None and self.ctx_min < self.ctx

    def fit(self, free: int) -> int | None:
        """The largest context from `ctx_min` to `ctx` (in steps of ALIGN) whose bytes fit `free`, or
        None when not even `ctx_min` does (or the asked context does not, when it is fixed)."""
        if self.ctx is None:
            return None if self.fixed > free else 0
        low = self.ctx_min if self.ctx_min is not None else self.ctx
        if self.at(low) > free:
            return None
        if self.at(self.ctx) <= free:
            return self.ctx
        lo, hi = low, self.ctx  # at(lo) fits, at(hi) does not
        while hi - lo > self.ALIGN:
            mid = (lo + hi) // 2 // self.ALIGN * self.ALIGN
            if mid <= lo:
                break
            lo, hi = (mid, hi) if self.at(mid) <= free else (lo, mid)
        return lo


def _folder_bytes(folder: Path) -> int:
    """A model folder's files (a faster-whisper or classifier model is a folder)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def install_action(recipe: str, backend: str) -> str:
    return f"lemonade backends install {recipe}:{backend}"


def fetch_refusal(config: Config, recipe: str, backend: str) -> str | None:
    """Why getting `recipe:backend` onto the machine (a download or a build) is not allowed now, or
    None: `no_fetch_executables` (packagers and locked-down machines: installed and system engines
    only). Checked wherever an install starts (first use, /v1/install, the CLI without a server)."""
    if not config.get("no_fetch_executables"):
        return None
    return (f"The {recipe}:{backend} backend is not installed, and no_fetch_executables is true, so Lemonade does "
            "not download or build engines. Install it another way (for llama.cpp, a llama-server on PATH and "
            "the 'system' backend), or allow it: lemonade config set no_fetch_executables=false")


def check_flags(text: str, forbidden: dict[str, str], allowed: Callable[[str], bool] | None = None, *,
                config_key: str = "llamacpp.args", examples: str = "threads, batch sizes, cache types, sampling, ...",
                instead: str = " Use the load options instead (e.g. ctx_size).") -> list[str]:
    """Tokenise user `*_args`, refusing flags the server sets itself (and, when given, any flag
    that `allowed` refuses). Raises ValueError naming the flag. `config_key` is the engine's
    server-wide setting, `examples` the kinds of flags allowed and `instead` what to use for a
    forbidden flag, all for the message."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"Cannot parse arguments '{text}': {exc}") from None
    for flag in flags_of(argv):
        if flag in forbidden:
            raise ValueError(f"Argument '{flag}' is not allowed in custom arguments: Lemonade sets "
                             f"{forbidden[flag]} itself.{instead}")
        if allowed is not None and not allowed(flag):
            raise ValueError(f"Argument '{flag}' is not allowed in custom arguments: only engine flags that touch "
                             f"neither files nor the network may be set per model or per request ({examples}). "
                             f"An admin can set other flags server-wide in the engine's config ({config_key}).")
    return argv


def check_native_args(text: str, *, trusted: bool, forbidden: dict[str, str], safe: frozenset[str],
                      known: frozenset[str], program: str, option: str, config_key: str, examples: str,
                      instead: str = "") -> list[str]:
    """Tokenise a native engine's `*_args` (whisper-server's, sd-server's): refused are the flags the
    server sets itself, any flag `program` does not know, and, unless `trusted` (the admin's
    server-wide `config_key`), a flag outside `safe` (one that may touch a file or the network)."""
    argv = check_flags(text, forbidden, config_key=config_key, instead=instead)
    unknown = [f for f in flags_of(argv) if f not in known]
    if unknown:
        name = program.split(" ", 1)[0]
        raise ValueError(f"Argument '{unknown[0]}' is not a flag {program} can run with: remove it from "
                         f"{option}. `{name} --help` lists its flags.")
    if not trusted:
        check_flags(text, forbidden, safe.__contains__, config_key=config_key, examples=examples, instead=instead)
    return argv


def flags_of(argv: list[str]) -> list[str]:
    """The flag tokens of an argument list (values, negative numbers included, are skipped)."""
    return [t.split("=", 1)[0] for t in argv if t.startswith("-") and not is_number(t)]


def is_number(token: str) -> bool:
    """`-1`, `0.5`: a value, not a flag, though it may start with a dash."""
    try:
        float(token)
        return True
    except ValueError:
        return False


def _args_problem(checker: Callable[..., list[str]]) -> Callable[[Any], str | None]:
    """A load option's check from an `args_checker`: why a model's own `*_args` text is refused, or None."""

    def check(value: Any) -> str | None:
        try:
            checker(value)
        except ValueError as exc:
            return str(exc)
        return None

    return check


class Engine(ABC):
    """One recipe's engine. Class attributes describe it; instances are bound to a cache dir."""

    recipe: ClassVar[str]
    # What the recipe serves, from its descriptor (set by `__init_subclass__`): deployment
    # modes, default first; modes served only with another label; the weight file format it loads.
    modes: ClassVar[tuple[str, ...]]
    label_modes: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    file_format: ClassVar[str | None] = None
    backends: ClassVar[tuple[str, ...]]  # every backend /v1/system-info lists (from the descriptor)
    # Recipe options besides the router's common ones. The backend and `*_args` options, where its
    # descriptor has those keys, and those of its settings that name an option, are added from it
    # (`__init_subclass__`); the first two are named here.
    options: ClassVar[dict[str, Option]] = {}
    args_option: ClassVar[str | None] = None
    backend_option: ClassVar[str | None] = None
    # The check of `*_args` text: (text, trusted=False) -> argv, ValueError naming a refused flag;
    # `trusted` is the admin's server-wide setting, request and per-model values get the allow-list.
    args_checker: ClassVar[Callable[..., list[str]]] = staticmethod(lambda text, trusted=False: check_flags(text, {}))
    # Performance parameters `lemonade bench` varies and auto-tune profiles set, each as the flag of
    # the engine's `args_option` that carries it (e.g. {"threads": "-t"}); empty: nothing to tune.
    tuning_flags: ClassVar[dict[str, str]] = {}
    process: ClassVar[str] = "engine"  # label of its processes in logs
    # Our endpoint -> the engine's path for it (a mode's requests are forwarded there).
    endpoints: ClassVar[dict[str, str]] = {}
    # Engine paths whose non-streamed requests are sent streamed (these fields added to the body) and
    # answered by the proxy from the chunks: for an engine that notices a client that left only while
    # it writes to it, so that hanging up stops a non-streamed generation too (runtime/assemble.py).
    streamed_for_cancel: ClassVar[dict[str, dict[str, Any]]] = {}
    metrics_path: ClassVar[str | None] = None  # Prometheus text the engine exposes, relayed by /metrics
    release_page: ClassVar[str | None] = None  # the upstream release its build is pinned to (system-info)
    # Audio containers a transcription engine decodes (names of audio/formats.py); an upload in another
    # one is refused with a 400 before the model loads. WAV is what the spec requires of every engine.
    audio_formats: ClassVar[tuple[str, ...]] = ("wav",)
    # What a loaded model's processes hold at most, by rule, for an engine without a finer estimate
    # (`memory_need`): a fixed part (the engine's own process: runtime, libraries) plus this many bytes per
    # byte of the model's files; measured per engine and written down in docs/memory.md.
    memory_base_bytes: ClassVar[int] = 0
    memory_per_weight_byte: ClassVar[float] = 1.0
    available: ClassVar[bool] = True  # False: known recipe whose engine this build does not ship
    connect_timeout: ClassVar[float] = 10.0  # seconds a remote engine may take to accept a connection
    # A remote engine on plain HTTP that our own lean client may talk to (runtime/engine_client.py):
    # a peer server; a cloud provider's API stays on aiohttp, which speaks whatever its proxy answers.
    lean_client: ClassVar[bool] = False
    # Where its models run. False: a process of ours per model, holding a slot of its type. True: a
    # service elsewhere (a cloud provider): no slot, no process, and requests leave through `outbound`.
    remote: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An engine class naming its recipe takes what it serves and its backends from its folder's
        descriptor (backends/<engine>/descriptor.py), the one place they are written."""
        super().__init_subclass__(**kwargs)
        descriptor = BY_RECIPE.get(cls.__dict__.get("recipe", ""))
        if descriptor is not None:
            cls.modes, cls.label_modes = descriptor.modes, descriptor.label_modes
            cls.file_format, cls.backends = descriptor.file_format, descriptor.backends
            cls.backend_option, cls.args_option = descriptor.backend_option, descriptor.args_option
            derived: dict[str, Option] = {}
            if descriptor.backend_option:
                derived[descriptor.backend_option] = Option(str, f"{descriptor.section}.backend",
                                                            check=descriptor.option_check(descriptor.backend_option))
            if descriptor.args_option:
                derived[descriptor.args_option] = Option(str, f"{descriptor.section}.args",
                                                         check=_args_problem(cls.args_checker))
            for setting in descriptor.settings:
                if setting.option:
                    derived[setting.option] = Option(setting.option_type, f"{descriptor.section}.{setting.key}",
                                                     check=descriptor.option_check(setting.option, setting.key))
            for option in descriptor.model_options:
                derived[option.name] = Option(option.type, None, default=option.default, check=option.problem)
            cls.options = {**cls.options, **derived}

    def __init__(self, cache_dir: Path, config: Config) -> None:
        self.cache_dir = Path(cache_dir)
        self.config = config
        # Whether a model whose `speculation` option is `auto` should speculate when it starts: the
        # verdict of the server's controller (runtime/speculation.py), passed in by services.
        self.speculation_wanted: Callable[[str], bool] = lambda _model: True

    @property
    def ready_timeout(self) -> float:
        """How long a starting engine may take to answer its health check (`global_timeout`)."""
        return float(self.config.get("global_timeout"))

    # ----- backends and their installation ---------------------------------------------------------
    @abstractmethod
    def state(self, backend: str) -> BackendState: ...

    def check_request(self, backend: str, force: bool = False) -> None:
        """Refuse unknown or unsupported backends before any work starts (InstallError). `force`
        (`/v1/install`'s): engines that filter backends by the machine's devices skip that filter."""
        if backend not in self.backends:
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        st = self.state(backend)
        if st.state == "unsupported":
            raise InstallError(f"{self.recipe}:{backend} cannot be installed: {st.message}", code="unsupported_backend")

    @abstractmethod
    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        """Blocking install (the server runs it in a thread). Never leaves a half install in place."""

    @abstractmethod
    def uninstall(self, backend: str) -> dict[str, Any]: ...

    def uninstall_refusal(self, backend: str) -> str | None:
        """Why `uninstall(backend)` would refuse, asked before the models using it are unloaded (a
        backend that is not Lemonade's to remove); None when it would go ahead."""
        return None

    def default_backend(self) -> str:
        return self.backends[0]

    def system_info(self) -> dict[str, Any]:
        """`recipes.<recipe>` of `/v1/system-info`; each backend with the `release_url` of the upstream
        release its build is pinned to, where there is one (Lemonade's app links it)."""
        backends = {b: self.state(b).to_dict() for b in self.backends}
        if self.release_page:
            for entry in backends.values():
                entry["release_url"] = self.release_page
        return {"default_backend": self.default_backend(), "backends": backends}

    def requested_backend(self, options: dict[str, Any]) -> str:
        value = options.get(self.backend_option) if self.backend_option else None
        return value or self.default_backend()

    def ready_backend(self, requested: str) -> str:
        """The backend a load will use; EngineUnavailable when it cannot be installed here."""
        st = self.state(requested)
        if st.state == "unsupported":
            raise EngineUnavailable(f"The {self.recipe} backend '{requested}' cannot run here: {st.message}",
                                    code="unsupported_backend", action=st.action)
        return requested

    def needs_install(self, backend: str) -> bool:
        return self.state(backend).state in ("installable", "update_required")

    # ----- options -----------------------------------------------------------------------------------
    def check_args(self, text: str, *, trusted: bool = False, backend: str | None = None) -> list[str]:
        """`*_args` as argv (`args_checker`); ValueError naming a refused flag. `backend`: also check
        against that installed backend's binary, where the engine can."""
        return self.args_checker(text, trusted=trusted)

    # ----- running a model ---------------------------------------------------------------------------
    def check_model(self, model: ModelInfo, backend: str) -> None:
        """Refuse, before any install or download, a model this engine's `backend` is known not to
        load (EngineUnavailable, a 400 naming why and what to do); by default every model is tried."""
        return None

    @abstractmethod
    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        """Start (and wait for) the engine process for `model` on a loopback `port`."""

    def encode_raw(self, path: str, content_type: str, launch: Launch | None = None) -> tuple[str, bytes, bytes, str]:
        """How a raw (non-JSON) request body for the engine path `path` (its query string holds the
        request's fields) is sent: (path, head, tail, content type), the body going untouched
        between head and tail, so a large upload is never copied. As it is by default; an engine
        whose server takes another shape frames it here (whisper-server: a multipart form; a peer:
        its public API's form, naming the model as `launch` says). May raise
        lemonade.errors.APIError for a field the engine cannot take."""
        return path, b"", b"", content_type

    def decode_raw(self, path: str, content: bytes) -> bytes:
        """The engine's answer to a raw request for `path`, in the shape our API module reads (for a
        transcription: `{"text", "language", "duration", "segments"}` as JSON)."""
        return content

    def raw_error(self, path: str, error: APIError) -> APIError:
        """The engine's refusal of a raw request for `path`, said in terms of our API's fields."""
        return error

    async def health_fields(self, loaded: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Fields this engine adds to `/v1/health` (e.g. llama.cpp's RPC workers and whether they
        answer), given the options of its loaded models by model name; nothing by default."""
        return {}

    async def exit_cause(self, launch: Launch) -> str | None:
        """Why an engine process that ended on its own did, when something outside it says so (llama.cpp:
        an RPC worker it was spread over is gone), for the error its clients get and `crashed_models`;
        None when nothing does. Quick: its callers wait for it (llamacpp/engine.py bounds its probes)."""
        return None

    def context_length(self, options: dict[str, Any], files: dict[str, list[Path]] | None) -> int | None:
        """Tokens a model loaded with these options could take: `ctx_size` as given (engines that
        size it automatically say what automatic means for these files)."""
        ctx = options.get("ctx_size")
        return ctx if isinstance(ctx, int) and ctx > 0 else None

    def memory_need(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any], backend: str,
                    cap_bytes: int | None = None) -> MemoryNeed | None:
        """The most a load of `model` with these options may hold in host memory, before it starts
        (docs/memory.md); None where it cannot be told (a remote engine, a GPU backend whose memory
        is the GPU's). By default the engine's rule on the size of the model's files."""
        if self.remote or not (self.memory_base_bytes or self.memory_per_weight_byte):
            return None
        weights = 0
        for paths in files.values():
            for path in paths:
                try:
                    weights += path.stat().st_size if path.is_file() else _folder_bytes(path)
                except OSError:
                    continue
        held = int(self.memory_base_bytes + self.memory_per_weight_byte * weights)
        return MemoryNeed(held, parts={"weights": weights, "engine": held - weights})

    async def downsize(self, base_url: str, client: EngineHTTP) -> bool:
        """Free dynamic memory of an idle model while keeping its weights; False when not possible."""
        return False

    # ----- warm swaps (docs/warm-swaps.md): what a model had read outlives its process ------------------
    async def save_warm(self, launch: Launch, client: EngineHTTP, keys: dict[int, str],
                        used: dict[int, float] | None = None) -> int:
        """Before an idle engine stops: save what it holds (per slot, `keys` saying which conversation and
        `used` when it was last used, wall clock) so a later load of the same configuration continues from
        it; the tokens saved. Nothing by default."""
        return 0

    async def restore_warm(self, launch: Launch, client: EngineHTTP) -> tuple[dict[int, str], int]:
        """After a start, before the first request: what was saved for exactly this configuration,
        restored; (the conversation each restored slot holds, tokens restored)."""
        return {}, 0

    async def share_slot(self, launch: Launch, client: EngineHTTP, src: int, dst: int) -> int:
        """Copy slot `src`'s state into the idle slot `dst` (`Launch.prefix_copy` engines only); the
        tokens copied."""
        return 0

    # ----- remote engines (remote = True): what leaves the machine and what comes back --------------
    def outbound(self, launch: Launch, path: str, body: dict[str, Any] | None,
                 headers: dict[str, str]) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
        """The URL, body and headers a request for our engine `path` ("/v1/chat/completions") is sent
        with: a remote engine adds its credentials and names the model as the service knows it."""
        return launch.server.base_url + path, body, headers

    def asks_stream_usage(self, path: str, body: dict[str, Any]) -> bool:
        """Whether a stream sent to this remote service asks for token usage on the client's behalf
        (for `/v1/stats` and the request's span); the proxy then keeps that usage-only event from the
        client, whose stream stays as it asked."""
        return False

    def upstream_error(self, launch: Launch, status: int, message: str) -> tuple[int, str, str] | None:
        """(status, message, code) for a remote service's refusal, or None to report it as it came."""
        return None

    def unreachable(self, launch: Launch, exc: BaseException) -> tuple[int, str, str]:
        """(status, message, code) when a remote service did not answer at all."""
        return 502, f"The service at {launch.server.base_url} did not answer: {exc}", "backend_unreachable"

    def launch_command(self, launch: Launch) -> list[str]:
        """The command the engine was started with, program first (health `launch_command`)."""
        return list(launch.server.argv)


class UnavailableEngine(Engine):
    """A recipe of the original Lemonade whose engine this build does not ship: listed truthfully."""

    available = False

    def __init__(self, cache_dir: Path, config: Config, recipe: str, modes: tuple[str, ...],
                 backends: tuple[str, ...] = ("default",), options: dict[str, Option] | None = None) -> None:
        super().__init__(cache_dir, config)
        self.recipe = recipe  # type: ignore[misc]  # instance-level description
        self.modes = modes  # type: ignore[misc]
        self.backends = backends  # type: ignore[misc]
        self.options = options or {}  # type: ignore[misc]

    def state(self, backend: str) -> BackendState:
        return BackendState(self.recipe, backend, "unsupported",
                            message=f"The {self.recipe} engine is not available in this build of Lemonade.")

    def check_request(self, backend: str, force: bool = False) -> None:
        raise InstallError(f"The {self.recipe} engine is not available in this build of Lemonade.",
                           code="unsupported_backend")

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend)
        return {}

    def uninstall(self, backend: str) -> dict[str, Any]:
        self.check_request(backend)
        return {}

    def system_info(self) -> dict[str, Any]:
        return {"backends": {b: self.state(b).to_dict() for b in self.backends}}

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        raise EngineUnavailable(f"Model {model.public} uses recipe '{self.recipe}', whose engine is not available "
                                "in this server yet.", code="model_load_refused")
