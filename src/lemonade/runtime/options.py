"""Recipe options and their priority chain (lemonade.md, "Setting Priority").

1. values in the load request, 2. the model's entry in `recipe_options.json`, 3. server config
(file, env, flags), 4. built-in defaults. A request value of `null` skips layer 2 for that key.
This module is the only place that knows the chain; `/v1/load`, `/v1/models/{id}/options` and
backend argument building all go through `resolve()`.
"""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path
from typing import Any

from lemonade.config import LLAMACPP_BACKENDS, Config
from lemonade.util.atomic import atomic_write_json, read_json

UNSET = object()  # "not in the request" as opposed to an explicit null

# recipe -> {option: (type, config key or None)}
RECIPE_OPTIONS: dict[str, dict[str, tuple[type | tuple[type, ...], str | None]]] = {
    "llamacpp": {"ctx_size": (int, "ctx_size"), "llamacpp_backend": (str, "llamacpp.backend"),
                 "llamacpp_args": (str, "llamacpp.args"), "merge_args": (bool, None)},
    "whispercpp": {"whispercpp_backend": (str, "whispercpp.backend"), "whispercpp_args": (str, "whispercpp.args"),
                   "merge_args": (bool, None)},
    "sd-cpp": {"steps": (int, "sdcpp.steps"), "cfg_scale": ((int, float), "sdcpp.cfg_scale"),
               "width": (int, "sdcpp.width"), "height": (int, "sdcpp.height"), "merge_args": (bool, None)},
    "flm": {"ctx_size": (int, "ctx_size"), "merge_args": (bool, None)},
    "ryzenai-llm": {"ctx_size": (int, "ctx_size"), "merge_args": (bool, None)},
}
DEFAULT_OPTIONS = {"merge_args": True}
ALL_OPTION_NAMES = sorted({k for opts in RECIPE_OPTIONS.values() for k in opts})

# Flags Lemonade sets itself; a user value would fight ours (lemonade.md, POST /v1/load).
FORBIDDEN_LLAMACPP_FLAGS = {
    "-m": "-m", "--model": "-m", "--port": "--port", "--host": "--host", "-c": "--ctx-size",
    "--ctx-size": "--ctx-size", "-ngl": "-ngl", "--n-gpu-layers": "-ngl", "--gpu-layers": "-ngl",
    "--jinja": "--jinja", "--mmproj": "--mmproj", "-mm": "--mmproj", "--embeddings": "--embeddings",
    "--embedding": "--embeddings", "--reranking": "--reranking", "--rerank": "--reranking",
}
FORBIDDEN_WHISPER_FLAGS = {"-m": "-m", "--model": "--model", "--port": "--port"}


class OptionsError(ValueError):
    """A bad option name or value; the message names it."""


def options_for(recipe: str) -> dict[str, tuple[type | tuple[type, ...], str | None]]:
    return RECIPE_OPTIONS.get(recipe, {"merge_args": (bool, None)})


def split_args(text: str, forbidden: dict[str, str]) -> list[str]:
    """Tokenise user `*_args`, refusing flags the server manages itself."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise OptionsError(f"Cannot parse arguments '{text}': {exc}") from None
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag in forbidden:
            raise OptionsError(f"Argument '{flag}' is not allowed in custom arguments: Lemonade sets "
                               f"{forbidden[flag]} itself. Use the load options instead (e.g. ctx_size).")
    return argv


def _flag_groups(argv: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for token in argv:
        if token.startswith("-") and not _is_number(token) or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def merge_args(global_args: str, model_args: str) -> str:
    """Global flags first, then per-model ones; a flag given in both keeps the per-model value."""
    model_groups = _flag_groups(shlex.split(model_args))
    overridden = {g[0].split("=", 1)[0] for g in model_groups}
    kept = [g for g in _flag_groups(shlex.split(global_args)) if g[0].split("=", 1)[0] not in overridden]
    return shlex.join([t for g in kept + model_groups for t in g])


def validate_option(recipe: str, key: str, value: Any) -> Any:
    known = options_for(recipe)
    if key not in known:
        if key in ALL_OPTION_NAMES:
            raise OptionsError(f"Option '{key}' does not apply to recipe '{recipe}'. It takes: "
                               f"{', '.join(sorted(known))}")
        raise OptionsError(f"Unknown option '{key}'. Options for recipe '{recipe}': {', '.join(sorted(known))}")
    if value is None:
        return None
    typ = known[key][0]
    if isinstance(value, bool) and typ is not bool or not isinstance(value, typ):
        names = {int: "an integer", str: "a string", bool: "true or false"}
        want = names.get(typ, "a number") if isinstance(typ, type) else "a number"
        raise OptionsError(f"Option '{key}' must be {want}, got {json.dumps(value)}")
    if key == "ctx_size" and value != -1 and value < 1:
        raise OptionsError(f"Option 'ctx_size' must be a positive integer or -1 (automatic), got {value}")
    if key in ("steps", "width", "height") and value < 1:
        raise OptionsError(f"Option '{key}' must be a positive integer, got {value}")
    if key == "llamacpp_backend" and value not in LLAMACPP_BACKENDS:
        raise OptionsError(f"Option 'llamacpp_backend' must be one of {', '.join(LLAMACPP_BACKENDS)}, got '{value}'")
    if key == "llamacpp_args":
        split_args(value, FORBIDDEN_LLAMACPP_FLAGS)
    if key == "whispercpp_args":
        split_args(value, FORBIDDEN_WHISPER_FLAGS)
    return value


class RecipeOptions:
    """`recipe_options.json` plus the layering logic."""

    def __init__(self, cache_dir: Path, config: Config) -> None:
        self.path = Path(cache_dir) / "recipe_options.json"
        self.config = config
        self._lock = threading.Lock()
        raw = read_json(self.path, {})
        self._saved: dict[str, dict[str, Any]] = raw if isinstance(raw, dict) else {}

    def saved(self, model_name: str) -> dict[str, Any]:
        return dict(self._saved.get(model_name, {}))

    def _write(self, model_name: str, entry: dict[str, Any] | None) -> None:
        with self._lock:
            new = dict(self._saved)
            if entry:
                new[model_name] = entry
            else:
                new.pop(model_name, None)
            atomic_write_json(self.path, new)
            self._saved = new

    def defaults(self, recipe: str) -> dict[str, Any]:
        """Layers 3 and 4: server config over built-in defaults."""
        out: dict[str, Any] = {}
        for key, (_typ, config_key) in options_for(recipe).items():
            out[key] = self.config.get(config_key) if config_key else DEFAULT_OPTIONS.get(key)
        return out

    def parse_request(self, recipe: str, body: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
        """Option keys present in a request body (values may be None = tombstone), validated."""
        out: dict[str, Any] = {}
        for key, value in body.items():
            if key in ignore:
                continue
            out[key] = validate_option(recipe, key, value)
        return out

    def resolve(self, model_name: str, recipe: str, request: dict[str, Any] | None = None,
                saved: dict[str, Any] | None = None) -> dict[str, Any]:
        """The effective options: request > saved > config > defaults, args merged per merge_args."""
        request = request or {}
        saved = self.saved(model_name) if saved is None else saved
        effective = self.defaults(recipe)
        for key in effective:
            if key in request and request[key] is not None:
                effective[key] = request[key]
            elif key in saved and request.get(key, UNSET) is UNSET:
                effective[key] = saved[key]
        for args_key, config_key in (("llamacpp_args", "llamacpp.args"), ("whispercpp_args", "whispercpp.args")):
            if args_key in effective and effective["merge_args"]:
                model_args = effective[args_key]
                global_args = self.config.get(config_key)
                if model_args != global_args:
                    effective[args_key] = merge_args(global_args, model_args)
        return effective

    def save_from_load(self, model_name: str, request: dict[str, Any], pinned: bool | None) -> None:
        """`save_options: true` on /v1/load: replace the entry; a null keeps the old value."""
        old = self.saved(model_name)
        entry = {k: v for k, v in request.items() if v is not None}
        entry.update({k: old[k] for k, v in request.items() if v is None and k in old})
        if pinned is not None:
            entry["pinned"] = pinned
        self._write(model_name, entry)

    def merge_saved(self, model_name: str, changes: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST /v1/models/{id}/options: merge; null removes a key. Returns the would-be entry."""
        entry = self.saved(model_name)
        for key, value in changes.items():
            if value is None:
                entry.pop(key, None)
            else:
                entry[key] = value
        if not dry_run:
            self._write(model_name, entry)
        return entry

    def reset(self, model_name: str) -> None:
        self._write(model_name, None)
