"""Server settings: `config.json` in the config dir, over layered defaults, under env vars and flags.

Layering (lowest first, guide-configuration-README.md "Defaults Precedence & Layering"):

1. built-in defaults (`DEFAULTS` below);
2. distro defaults: `/usr/share/lemonade/defaults.json`, when it exists (Linux packages);
3. `LEMONADE_DEFAULTS_PATH`: a `defaults.json` anywhere (Nix, Guix and other non-FHS packagers);
4. `config.json`: a sparse override file holding only what the user set (`lemonade config set`,
   `POST /internal/set`), so everything else keeps following the defaults across updates;
5. `LEMONADE_*` environment variables, then `lemonade serve` flags (ephemeral, never written);
6. `POST /v1/params`: live changes that last until the server stops (Lemonade's runtime settings
   endpoint); a persisted `set` of the same key replaces them.

Per-request and per-model options layer on top of that in `runtime/options.py`. The key names are
the ones Lemonade users already script against (`lemonade config set llamacpp.args=...`), so they
must not be renamed.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lemonade.backends.descriptors import BY_SECTION
from lemonade.route_table import PREFIXES
from lemonade.util.atomic import atomic_write_json, read_json

# Every settable key with its default; the type of the default is the type a value must have
# (ints accept -1 where documented, floats accept ints).
DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 13305,
    "websocket_port": "auto",  # the legacy dedicated WebSocket port: "auto" (OS-assigned) or a port number
    "log_level": "info",
    "ctx_size": -1,
    "max_loaded_models": 1,  # or a map per model type, e.g. {"llm": 2, "transcription": 1}
    "auto_evict": False,  # unload models idle longer than their evict_idle_timeout, or under memory pressure
    "auto_evict_threshold_pct": 0.90,  # with auto_evict: memory use (fraction) that evicts (router/housekeeping.py)
    "global_timeout": 600,  # seconds: an engine start may take; a cloud provider may stay silent
    "max_queue_depth": 256,  # requests waiting for a model slot; more get 503 + Retry-After
    "swap_batch": 32,  # requests a model serves before it yields its slot to a waiting model
    "kv_store_gb": 4.0,  # warm swaps: saved conversation states kept on disk (least recently used go first); 0: off
    "engine_watchdog_seconds": 120,  # a busy engine that makes no progress this long is killed
    "max_request_body_mb": 64,  # larger request bodies get 413 (audio uploads and base64 images fit)
    "offline": False,
    "no_fetch_executables": False,  # never download or build engines; installed and system ones still work
    "disable_model_filtering": False,  # list models bigger than this machine's memory too (catalog/fit.py)
    "enable_dgpu_gtt": False,  # count a discrete AMD GPU's GTT (shared system memory) when filtering by size
    "broadcast": True,  # UDP discovery beacons (beacon.py), so apps and `lemonade scan` find this server
    # Other servers of the LAN to forward requests to (backends/peer/peers.py, docs/scale-out.md): base URLs, or
    # "auto" for the servers heard by the discovery beacons; every member needs the same LEMONADE_PEER_KEY
    "peers": [],
    "extra_models_dir": "",
    "models_dir": "",
    "auto_check_model_updates": True,
    "default_model_source": "huggingface",
    # Each engine's section ("llamacpp", "whispercpp", "kokoro", "sdcpp", "vllm"), from its descriptor
    # (backends/<engine>/descriptor.py): `backend`, `args`, its own keys, `<backend>_bin`, `<backend>_args`.
    **{section: descriptor.config_defaults() for section, descriptor in BY_SECTION.items()},
    # Cloud OpenAI-compatible providers (guide-configuration-cloud.md): name, base_url, auth header; never keys.
    "cloud_providers": [],
    # Inference spans over OTLP (observability/telemetry.py); off by default. session.headers: request
    # headers read for session.id (id) and its client prefix (client), before the well-known ones.
    "telemetry": {"enabled": False, "hide_inputs": False, "hide_outputs": False, "hide_thinking": False,
                  "trust_incoming_trace_context": False, "max_queue_capacity": 1000, "max_attribute_length": 4096,
                  "otlp": {"endpoint": "http://localhost:4318/v1/traces", "protocol": "http/protobuf", "headers": {},
                           "semantics": ["openinference", "otel_genai"], "send_batch_size": 100,
                           "batch_timeout_s": 1.0, "max_retries": 0, "retry_backoff_base_s": 5.0},
                  "session": {"headers": {"id": [], "client": []}}},
    "auto_tune": True,  # apply the hardware archetype's performance profile at load (autotune/)
    "inhibit_suspend": True,  # keep the OS from suspending while inference runs (system/suspend.py; Linux/logind)
}

# `<section>.<backend>_args`: an engine's server-wide flags for one of its backends, used instead of
# `<section>.args` when not empty (guide-configuration-README.md, "Backend Configuration"; the options
# layer picks them for the backend a load runs on, runtime/options.py): every backend each engine lists, as
# upstream Lemonade lists them, so a migrated config.json keeps every such key.
BACKEND_ARGS = {section: d.backends for section, d in BY_SECTION.items() if d.args_key}
BIN_SECTIONS = tuple(section for section, d in BY_SECTION.items()  # engines whose `<backend>_bin` selects a build
                     if d.bins and d.bin_rule is not None and d.bin_rule.example_tag)
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "fatal", "none")
MODEL_SOURCES = ("huggingface", "modelscope")
MAX_CTX_SIZE = 1 << 24  # 16M tokens: above any model's trained length; larger values could only fail at load


class ConfigError(ValueError):
    """A key or value that cannot be set; the message names it."""


# Keys whose value may be a JSON object of their own (not a config section).
MAP_KEYS = ("max_loaded_models", "telemetry.otlp.headers")
TELEMETRY_SEMANTICS = ("openinference", "otel_genai")
OTLP_PROTOCOLS = ("http/protobuf", "http/json")
MODEL_TYPE_NAMES = ("llm", "embedding", "reranking", "transcription", "image", "tts", "audio", "classification",
                    "3d")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in MAP_KEYS:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_DEFAULT_LEAVES = _flatten(DEFAULTS)


def validate_value(key: str, value: Any) -> Any:
    """Check one dotted key against the schema; returns the value, coerced where lossless."""
    if key not in _DEFAULT_LEAVES:
        raise ConfigError(f"Unknown config key '{key}'. Known keys: {', '.join(sorted(_DEFAULT_LEAVES))}")
    default = _DEFAULT_LEAVES[key]
    if key == "cloud_providers":
        return _cloud_providers(value)
    if key == "peers":
        return _peers(value)
    engine, _, engine_key = key.partition(".")
    descriptor = BY_SECTION.get(engine)
    setting = descriptor.setting(engine_key) if descriptor else None
    if setting is not None and setting.normalize is not None:
        try:
            return setting.normalize(value, key)
        except ValueError as exc:
            raise ConfigError(f"Config key {exc}") from None
    if key == "telemetry.otlp.headers":
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"Config key '{key}' must be a JSON object of header names to string values")
        return value
    if key in ("telemetry.session.headers.id", "telemetry.session.headers.client"):
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ConfigError(f"Config key '{key}' must be a list of header names, e.g. [\"x-my-session\"]; "
                              f"got {json.dumps(value)}")
        return value
    if key == "telemetry.otlp.semantics":
        if not isinstance(value, list) or not value or any(v not in TELEMETRY_SEMANTICS for v in value):
            raise ConfigError(f"Config key '{key}' must be a non-empty list of {', '.join(TELEMETRY_SEMANTICS)}, "
                              f"got {json.dumps(value)}")
        return value
    if key in MAP_KEYS and isinstance(value, dict):
        return _validate_type_map(key, value)
    if key == "websocket_port":
        return _websocket_port(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"Config key '{key}' must be true or false, got {json.dumps(value)}")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"Config key '{key}' must be an integer, got {json.dumps(value)}")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"Config key '{key}' must be a number, got {json.dumps(value)}")
        value = float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"Config key '{key}' must be a string, got {json.dumps(value)}")
    problem = descriptor.problem(engine_key, value) if descriptor else None
    if problem:
        raise ConfigError(f"Config key {problem}")
    _check_range(key, value)
    return value


def _cloud_providers(value: Any) -> list[dict[str, Any]]:
    """`[{"name", "base_url", ...}]`: the persisted half of each provider (backends/cloud/providers.py
    checks the fields themselves when a provider is installed)."""
    if not isinstance(value, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                              and isinstance(p.get("base_url"), str) for p in value):
        raise ConfigError("Config key 'cloud_providers' must be a list of objects with 'name' and 'base_url' "
                          "(manage it with lemonade cloud install/uninstall)")
    return value


def _peers(value: Any) -> str | list[str]:
    """"auto", or a list of base URLs (http:// or https://, with a host; a trailing slash or /api/v1 is
    dropped: the peer's API is found under it as under any server's)."""
    if value == "auto":
        return value
    usage = ("Config key 'peers' must be \"auto\" (the servers heard by discovery beacons) or a list of base URLs "
             "such as [\"http://10.0.0.2:13305\"]")
    if not isinstance(value, list):
        raise ConfigError(f"{usage}, got {json.dumps(value)}")
    out: list[str] = []
    for entry in value:
        parts = urlsplit(entry.strip()) if isinstance(entry, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ConfigError(f"{usage}; {json.dumps(entry)} is not an http:// or https:// URL with a host")
        try:
            parts.port  # noqa: B018 - raises for a port out of range
        except ValueError:
            raise ConfigError(f"{usage}; {json.dumps(entry)} has no valid port") from None
        path = parts.path.rstrip("/")
        for suffix in sorted(PREFIXES, key=len, reverse=True):  # "/api/v1" before its tail "/v1"
            if path.endswith(suffix):
                path = path.removesuffix(suffix)
                break
        url = f"{parts.scheme}://{parts.netloc}{path}"
        if url not in out:
            out.append(url)
    return out


def _websocket_port(value: Any) -> str | int:
    """"auto" or a port number (also as text, as env vars and `config set` give it)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535):
        return value
    raise ConfigError("Config key 'websocket_port' must be \"auto\" or a port from 1 to 65535, got "
                      + json.dumps(value))


def _validate_type_map(key: str, value: dict[str, Any]) -> dict[str, int]:
    """`{"llm": 2, "transcription": 1}`: a limit per model type (types left out keep the default 1)."""
    out: dict[str, int] = {}
    for typ, limit in value.items():
        if typ not in MODEL_TYPE_NAMES:
            raise ConfigError(f"Config key '{key}': unknown model type '{typ}'. Types: {', '.join(MODEL_TYPE_NAMES)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or (limit != -1 and limit < 1):
            raise ConfigError(f"Config key '{key}.{typ}' must be a positive integer or -1, got {json.dumps(limit)}")
        out[typ] = limit
    return out


def _check_range(key: str, value: Any) -> None:
    if key == "port" and not 1 <= value <= 65535:
        raise ConfigError(f"Config key 'port' must be between 1 and 65535, got {value}")
    if key == "ctx_size" and value != -1 and not 1 <= value <= MAX_CTX_SIZE:
        raise ConfigError(f"Config key 'ctx_size' must be from 1 to {MAX_CTX_SIZE} tokens, or -1; got {value}")
    if key == "max_loaded_models" and value != -1 and value < 1:
        raise ConfigError(f"Config key '{key}' must be a positive integer or -1, got {value}")
    if key in ("max_queue_depth", "swap_batch", "engine_watchdog_seconds", "max_request_body_mb", "global_timeout") \
            and value < 1:
        raise ConfigError(f"Config key '{key}' must be a positive integer, got {value}")
    if key == "kv_store_gb" and value < 0:
        raise ConfigError(f"Config key 'kv_store_gb' must be 0 (warm swaps off) or more gigabytes, got {value}")
    if key == "auto_evict_threshold_pct" and not 0.0 < value <= 1.0:
        raise ConfigError(f"Config key '{key}' must be a fraction above 0 and at most 1 (0.90 = 90 %), got {value}")
    if key == "log_level" and value.lower() not in LOG_LEVELS:
        raise ConfigError(f"Config key 'log_level' must be one of {', '.join(LOG_LEVELS)}, got '{value}'")
    if key == "default_model_source" and value not in MODEL_SOURCES:
        raise ConfigError(f"Config key 'default_model_source' must be one of {', '.join(MODEL_SOURCES)}")
    if key == "telemetry.otlp.protocol" and value not in OTLP_PROTOCOLS:
        raise ConfigError(f"Config key '{key}' must be one of {', '.join(OTLP_PROTOCOLS)}, got '{value}'")
    if key in ("telemetry.max_queue_capacity", "telemetry.otlp.send_batch_size", "telemetry.otlp.batch_timeout_s",
               "telemetry.max_attribute_length") and value <= 0:
        raise ConfigError(f"Config key '{key}' must be positive, got {value}")
    if key in ("telemetry.otlp.max_retries", "telemetry.otlp.retry_backoff_base_s") and value < 0:
        raise ConfigError(f"Config key '{key}' must be 0 or more, got {value}")
    if key == "telemetry.otlp.endpoint" and not value.startswith(("http://", "https://")):
        raise ConfigError(f"Config key '{key}' must be an http:// or https:// URL, got '{value}'")


def validate_tree(updates: dict[str, Any]) -> dict[str, Any]:
    """Validate a partial nested object (as `/internal/set` and `/v1/params` receive it) before
    anything is written. Flat backend keys (`llamacpp_args`, Lemonade's recipe-option spelling) mean
    their nested key (`llamacpp.args`)."""
    if not isinstance(updates, dict) or not updates:
        raise ConfigError("Expected a non-empty JSON object of settings, e.g. {\"max_loaded_models\": 2}")
    flat: dict[str, Any] = {}
    for key, value in _promote_flat_keys(_flatten_updates(updates)).items():
        flat[key] = validate_value(key, value)
    return flat


def _promote_flat_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"llamacpp_args": ...}` -> `{"llamacpp.args": ...}`: a top-level key that starts with a
    section's name and an underscore, where that section has the rest as a key. Both spellings with
    different values is an error rather than a silent pick."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in flat.items():
        target = key
        if "." not in key and key not in _DEFAULT_LEAVES:
            section, _, rest = key.partition("_")
            if rest and isinstance(DEFAULTS.get(section), dict) and f"{section}.{rest}" in _DEFAULT_LEAVES:
                target = f"{section}.{rest}"
        if target in out and out[target] != value:
            raise ConfigError(f"Ambiguous settings: both '{given[target]}' and '{key}' were given, with different "
                              "values; give one")
        out[target] = value
        given.setdefault(target, key)
    return out


def _flatten_updates(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Like `_flatten`, but a dict value under a leaf key is an error, not a subtree."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in _DEFAULT_LEAVES:
            if not value:
                raise ConfigError(f"Config section '{path}' is empty")
            out.update(_flatten_updates(value, path + "."))
        else:
            out[path] = value
    return out


def parse_cli_value(key: str, raw: str) -> Any:
    """Turn `KEY=VALUE` text from the command line into the schema's type for KEY."""
    if key not in _DEFAULT_LEAVES:
        validate_value(key, raw)  # raises the unknown-key error
    default = _DEFAULT_LEAVES[key]
    engine, _, engine_key = key.partition(".")
    setting = BY_SECTION[engine].setting(engine_key) if engine in BY_SECTION else None
    if setting is not None and setting.from_text is not None:
        try:  # e.g. `LEMONADE_LLAMACPP_RPC_WORKERS=10.0.0.2:50052,10.0.0.3:50052`, or `auto`
            return setting.from_text(raw)
        except ValueError:
            raise ConfigError(f"Config key '{key}' takes JSON, e.g. {json.dumps(default)}; got '{raw}'") from None
    if key == "peers" and not raw.strip().startswith("["):  # `LEMONADE_PEERS=auto`, or a comma list of URLs
        return "auto" if raw.strip() == "auto" else [u.strip() for u in raw.split(",") if u.strip()]
    if isinstance(default, (list, dict)) and key != "max_loaded_models":
        try:
            return json.loads(raw)
        except ValueError:
            raise ConfigError(f"Config key '{key}' takes JSON, e.g. {json.dumps(default)}; got '{raw}'") from None
    if key in MAP_KEYS and raw.strip().startswith("{"):
        try:
            return _validate_type_map(key, json.loads(raw))
        except (ValueError, AttributeError):
            raise ConfigError(f"Config key '{key}' must be an integer or a JSON object such as "
                              '{"llm": 2}, got ' + f"'{raw}'") from None
    if isinstance(default, bool):
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"Config key '{key}' must be true or false, got '{raw}'")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"Config key '{key}' must be an integer, got '{raw}'") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"Config key '{key}' must be a number, got '{raw}'") from None
    return raw


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """`LEMONADE_MAX_LOADED_MODELS=2`, `LEMONADE_LLAMACPP_ARGS=...`, `LEMONADE_LLAMACPP=cpu` (backend)."""
    tree: dict[str, Any] = {}
    for key in _DEFAULT_LEAVES:
        names = ["LEMONADE_" + key.replace(".", "_").upper()]
        if key.endswith(".backend"):
            names.append("LEMONADE_" + key.split(".")[0].upper())
        for name in names:
            if name in environ and environ[name] != "":
                _set_path(tree, key, validate_value(key, parse_cli_value(key, environ[name])))
                break
    return tree


SYSTEM_DEFAULTS_PATH = Path("/usr/share/lemonade/defaults.json")  # distro packages' defaults (Linux)
DEFAULTS_PATH_ENV = "LEMONADE_DEFAULTS_PATH"  # a defaults.json anywhere (non-FHS packagers: Nix, Guix)


def _clean_tree(raw: Any, source: Path, notes: list[str], kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """The valid settings of a hand-written JSON file (config.json, a defaults.json). Unknown or
    invalid keys are left out rather than fatal, so one typo does not stop the server; `notes` gets
    a line naming them (the server logs it once logging is set up), and `kept`, when given, their
    values as they were, so that rewriting the file loses none of them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} must hold a JSON object; fix or delete it")
    clean: dict[str, Any] = {}
    skipped: list[str] = []
    for key, value in _flatten(raw).items():
        try:
            _set_path(clean, key, validate_value(key, value))
        except ConfigError as exc:
            skipped.append(f"{key} ({exc})" if key in _DEFAULT_LEAVES else key)
            if kept is not None:
                _set_path(kept, key, value)
    if skipped:
        notes.append(f"Ignoring settings in {source} that this Lemonade does not know or cannot use (they stay in "
                     "the file): " + "; ".join(skipped))
    return clean


def layered_defaults(environ: Mapping[str, str] | None = None, notes: list[str] | None = None,
                     system_path: Path = SYSTEM_DEFAULTS_PATH) -> dict[str, Any]:
    """Built-in defaults, then the distro's `defaults.json`, then `LEMONADE_DEFAULTS_PATH`'s: what a
    key is when neither config.json, the environment nor a flag sets it."""
    env = os.environ if environ is None else environ
    notes = [] if notes is None else notes
    tree = copy.deepcopy(DEFAULTS)
    layers = [system_path] if sys.platform != "win32" else []
    if env.get(DEFAULTS_PATH_ENV):
        layers.append(Path(env[DEFAULTS_PATH_ENV]).expanduser())
    for path in layers:
        if path.is_file():
            tree = deep_merge(tree, _clean_tree(read_json(path, {}), path, notes))
        elif path != system_path:
            notes.append(f"{DEFAULTS_PATH_ENV}={path}: no such file; using the built-in defaults")
    return tree


class Config:
    """The server's settings with their layers kept apart, so `config set` persists only what the user
    set. `config_dir` is the folder of `config.json` (lemonade.paths.config_dir)."""

    def __init__(self, config_dir: Path, cli_overrides: dict[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.dir = Path(config_dir)
        self.path = self.dir / "config.json"
        self._lock = threading.Lock()
        env = dict(os.environ if environ is None else environ)
        self.notes: list[str] = []  # warnings about the files read, logged by the server at startup
        self.defaults = layered_defaults(env, self.notes)
        # What config.json holds that this server does not use (another Lemonade's keys, a value it
        # refuses): kept as it is when the file is written again, never dropped.
        self._kept: dict[str, Any] = {}
        self._file = self._load_file()
        self._overrides = deep_merge(_env_overrides(env), cli_overrides or {})
        if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            self._overrides["offline"] = True
        self._runtime: dict[str, Any] = {}  # POST /v1/params: live until the server stops
        self._listeners: list[Any] = []
        self._checks: dict[str, Any] = {}
        self._merged: dict[str, Any] | None = None  # all layers merged; rebuilt after `set`

    def add_check(self, key: str, check: Any) -> None:
        """A check that needs more than the schema (e.g. engine flags against the installed binary):
        `check(value)` raises ConfigError; `set` runs it before anything is written."""
        self._checks[key] = check

    def _load_file(self) -> dict[str, Any]:
        try:
            raw = read_json(self.path, {})
        except ValueError as exc:
            raise ConfigError(f"{self.path} is not valid JSON ({exc}); fix or delete it") from None
        return _clean_tree(raw, self.path, self.notes, self._kept)

    def _effective(self) -> dict[str, Any]:
        """The merged layers, computed once per change: `get` runs on hot paths (the router's
        scheduler, housekeeping every second) and a deep merge of every layer costs far more than
        the lookup (docs/performance.md)."""
        merged = self._merged
        if merged is None:
            merged = deep_merge(deep_merge(self.defaults, self._file), self._overrides)
            merged = self._merged = deep_merge(merged, self._runtime)
        return merged

    @property
    def values(self) -> dict[str, Any]:
        """Effective settings, all layers merged (a copy the caller may change)."""
        return copy.deepcopy(self._effective())

    def get(self, dotted: str) -> Any:
        node: Any = self._effective()
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"Unknown config key '{dotted}'")
            node = node[part]
        return copy.deepcopy(node) if isinstance(node, (dict, list)) else node

    def user_set(self, dotted: str) -> bool:
        """Did the user give this key (config file, env var, flag or /v1/params), as opposed to a
        default? Auto-tune profiles fill in only what the user left at its default."""
        return any(dotted in _flatten(layer) for layer in (self._file, self._overrides, self._runtime))

    def overridden_keys(self) -> list[str]:
        """Keys whose file value is shadowed by an env var or flag (reported by `config set`)."""
        return sorted(_flatten(self._overrides))

    def _checked(self, updates: dict[str, Any]) -> dict[str, Any]:
        flat = validate_tree(updates)
        for key, value in flat.items():
            if key in self._checks:
                self._checks[key](value)
        return flat

    def set(self, updates: dict[str, Any]) -> dict[str, Any]:
        """Validate all, then persist atomically and notify listeners. Nothing is written on error.
        A key set this way also replaces a live `/v1/params` value of it: the latest change wins."""
        flat = self._checked(updates)
        with self._lock:
            new_file = copy.deepcopy(self._file)
            for key, value in flat.items():
                _set_path(new_file, key, value)
            kept = _without(self._kept, flat)
            atomic_write_json(self.path, deep_merge(kept, new_file))
            self._file, self._kept = new_file, kept
            self._runtime = _without(self._runtime, flat)
            self._merged = None
        self._notify(flat)
        return flat

    def set_runtime(self, updates: dict[str, Any]) -> dict[str, Any]:
        """`POST /v1/params` and `/internal/set?persist=false` (`lemonade telemetry on|off`): the same
        validation, applied now and never written; gone at restart."""
        flat = self._checked(updates)
        with self._lock:
            runtime = copy.deepcopy(self._runtime)
            for key, value in flat.items():
                _set_path(runtime, key, value)
            self._runtime = runtime
            self._merged = None
        self._notify(flat)
        return flat

    def _notify(self, flat: dict[str, Any]) -> None:
        for listener in self._listeners:
            listener(flat)

    def on_change(self, listener: Any) -> None:
        self._listeners.append(listener)


def _without(tree: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """`tree` with the dotted `keys` removed (and sections they leave empty)."""
    out = copy.deepcopy(tree)
    for dotted in keys:
        parts = dotted.split(".")
        trail = [out]
        for part in parts[:-1]:
            node = trail[-1].get(part)
            if not isinstance(node, dict):
                break
            trail.append(node)
        else:
            trail[-1].pop(parts[-1], None)
            for depth in range(len(parts) - 2, -1, -1):
                if not trail[depth + 1]:
                    trail[depth].pop(parts[depth], None)
    return out


def flatten(tree: dict[str, Any]) -> dict[str, Any]:
    """`{"telemetry": {"enabled": false}}` -> `{"telemetry.enabled": false}` (how the CLI prints it)."""
    return _flatten(tree)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"telemetry.enabled": false}` -> `{"telemetry": {"enabled": false}}` (how API answers show it)."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        _set_path(tree, key, value)
    return tree


def set_on_disk(config_dir: Path, updates: dict[str, Any]) -> dict[str, Any]:
    """`lemonade config set` when no server runs: same validation, same atomic write."""
    return Config(config_dir, environ={}).set(updates)
