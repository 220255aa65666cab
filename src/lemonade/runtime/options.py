"""Recipe options and their priority chain (lemonade.md, "Setting Priority"; custom-models.md,
"Settings Priority").

1. values in the load request, 2. the model's entry in `recipe_options.json` (over the built-in
catalog entry's own `recipe_options`, e.g. a vLLM model's tool-call parser), 3. the model's
architecture defaults (`catalog/architecture_defaults.py`: keyed by the GGUF architecture of its
file), 4. server config (file, env, flags, `/v1/params`), 5. the auto-tune profile of this
machine's archetype (`autotune/`; only keys the user left at their default), 6. built-in defaults.
A request value of `null` skips layer 2 for that key.

`*_args` are merged flag by flag (`merge_args`, on by default): the request's, else the model's
over its architecture's, over the server-wide flags, which are `<section>.<backend>_args` for the
backend the load runs on when that is set, else `<section>.args` (guide-configuration-README.md).
With `merge_args: false` the highest layer that gives flags is used alone.
This module is the only place that knows the chain; `/v1/load`, `/v1/models/{id}/options` and
backend argument building all go through `resolve()`.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemonade.backends.engine import Option, is_number
from lemonade.backends.registry import all_option_names, args_options, recipe_modes, recipe_options
from lemonade.backends.tuning import backend_option
from lemonade.catalog.architecture_defaults import for_architecture
from lemonade.config import BACKEND_ARGS, Config
from lemonade.errors import APIError
from lemonade.recipes import file_format
from lemonade.util.atomic import atomic_write_json, read_json

log = logging.getLogger("lemonade.options")
UNSET = object()  # "not in the request" as opposed to an explicit null
# Where an effective option came from, highest first (`/v1/models/{id}/options` `layers`): the load
# request, recipe_options.json, the built-in model's own options, the architecture defaults, the
# server's configuration as set by the user, the auto-tune profile, the built-in (or packaged) defaults.
LAYERS = ("request", "saved", "model", "architecture", "config", "auto_tune", "default")


def _non_negative(name: str) -> Any:
    return lambda v: None if v >= 0 else f"Option '{name}' must be 0 or more, got {v}"


# Options every recipe takes: residency belongs to the router, not to an engine
# (guide-configuration-multi-model.md, "Per-model eviction settings").
# Idle timeouts are whole seconds, as in Lemonade (a fractional value is refused, not rounded).
COMMON_OPTIONS: dict[str, Option] = {
    "auto_evict": Option(bool, None, default=None),  # null: the server-wide `auto_evict` decides
    "evict_idle_timeout": Option(int, None, default=300, check=_non_negative("evict_idle_timeout")),
    "downsize_idle_timeout": Option(int, None, default=60, check=_non_negative("downsize_idle_timeout")),
    "evict_weight_factor": Option((int, float), None, default=1.0, check=_non_negative("evict_weight_factor")),
    "merge_args": Option(bool, None, default=True),
}


# The router's own options: how long a model stays, not how its engine runs. `/v1/health` lists a
# loaded model's `recipe_options` without them (the engine's options, as Lemonade shows them).
RESIDENCY_OPTIONS = ("auto_evict", "evict_idle_timeout", "downsize_idle_timeout", "evict_weight_factor")


class OptionsError(ValueError):
    """A bad option name or value; the message names it."""


def options_for(recipe: str) -> dict[str, Option]:
    return {**recipe_options(recipe), **COMMON_OPTIONS}


def all_options() -> dict[str, Option]:
    """Every option of any recipe (what /openapi.json documents for load and options bodies)."""
    out: dict[str, Option] = {}
    for recipe in recipe_modes():
        out.update(recipe_options(recipe))
    return {**out, **COMMON_OPTIONS}


def _flag_groups(argv: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for token in argv:
        if token.startswith("-") and not is_number(token) or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def merge_args(global_args: str, model_args: str) -> str:
    """Global flags first, then per-model ones; a flag given in both keeps the per-model value."""
    model_groups = _flag_groups(shlex.split(model_args))
    overridden = {g[0].split("=", 1)[0] for g in model_groups}
    kept = [g for g in _flag_groups(shlex.split(global_args)) if g[0].split("=", 1)[0] not in overridden]
    return shlex.join([t for g in kept + model_groups for t in g])


def _layered(parts: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """`*_args` texts given highest layer first, merged flag by flag (a higher layer's flag wins), and
    the names of the layers that gave any."""
    text = ""
    for part, _ in reversed(parts):
        if part:
            text = merge_args(text, part) if text else part
    return text, [name for part, name in parts if part and name]


def tuned_in_force(tuned: dict[str, Any], effective: dict[str, Any]) -> dict[str, Any]:
    """Of auto-tune's options, those the effective options still hold (for `*_args`: the profile's
    flags that kept their value)."""
    out: dict[str, Any] = {}
    args_keys = args_options()
    for key, value in tuned.items():
        if key in args_keys:
            have = {tuple(g) for g in _flag_groups(shlex.split(str(effective.get(key) or "")))}
            kept = [t for g in _flag_groups(shlex.split(value)) if tuple(g) in have for t in g]
            if kept:
                out[key] = shlex.join(kept)
        elif effective.get(key) == value:
            out[key] = value
    return out


_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false", list: "a list"}


def validate_option(recipe: str, key: str, value: Any) -> Any:
    known = options_for(recipe)
    if key not in known:
        if key in all_option_names():
            raise OptionsError(f"Option '{key}' does not apply to recipe '{recipe}'. It takes: "
                               f"{', '.join(sorted(known))}")
        raise OptionsError(f"Unknown option '{key}'. Options for recipe '{recipe}': {', '.join(sorted(known))}")
    if value is None:
        return None
    spec = known[key]
    typ = spec.type
    if isinstance(value, bool) and typ is not bool or not isinstance(value, typ):
        want = _TYPE_NAMES.get(typ, "a number") if isinstance(typ, type) else \
            " or ".join(_TYPE_NAMES[t] for t in typ) if all(t in _TYPE_NAMES for t in typ) else "a number"
        raise OptionsError(f"Option '{key}' must be {want}, got {json.dumps(value)}")
    problem = spec.check(value) if spec.check else None
    if problem:
        raise OptionsError(problem)
    return value


class RecipeOptions:
    """`recipe_options.json` plus the layering logic."""

    def __init__(self, config_dir: Path, config: Config) -> None:
        self.path = Path(config_dir) / "recipe_options.json"
        self.config = config
        self._lock = threading.Lock()
        raw = read_json(self.path, {})
        self._saved: dict[str, dict[str, Any]] = raw if isinstance(raw, dict) else {}
        # Auto-tune's layer: (model name, recipe, backend or None) -> options; None = no auto-tune.
        self.tuning: Callable[[str, str, str | None], dict[str, Any]] | None = None
        # A built-in model's own `recipe_options` (catalog), under the saved ones: model name -> options.
        self.model_defaults: Callable[[str], dict[str, Any]] = lambda _name: {}
        # The GGUF architecture of a model's file (None: not downloaded, or not a GGUF): model name -> name.
        self.architecture_of: Callable[[str], str | None] = lambda _name: None
        # The backend a load with these effective options runs on: (recipe, options) -> backend name.
        self.backend_of: Callable[[str, dict[str, Any]], str | None] = lambda _recipe, _options: None

    def migrate_keys(self, canonical_key: Callable[[str], str | None]) -> int:
        """Rewrite keys written under an older naming to the model's canonical id, in one atomic write
        (guide-configuration-custom-models.md: a bare key naming a built-in becomes `builtin.NAME`;
        this server's old `extra.<file>.gguf` ids become `extra.<stem>`). Keys naming nothing known
        are kept as they are, and a key whose canonical form is already present is left alone."""
        with self._lock:
            renamed: dict[str, Any] = {}
            moved = 0
            for key, value in self._saved.items():
                target = canonical_key(key)
                if target and target != key and target not in self._saved and target not in renamed:
                    renamed[target] = value
                    moved += 1
                else:
                    renamed.setdefault(key, value)
            if moved:
                atomic_write_json(self.path, renamed)
                self._saved = renamed
                log.info("Migrated %d key(s) of %s to canonical model ids", moved, self.path)
            return moved

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
        """Layers 4 and 6: server config over built-in defaults."""
        out: dict[str, Any] = {}
        for key, spec in options_for(recipe).items():
            out[key] = self.config.get(spec.config_key) if spec.config_key else spec.default
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
                saved: dict[str, Any] | None = None, *, for_load: bool = True) -> dict[str, Any]:
        """The effective options (see the module's docstring for the chain)."""
        return self.resolve_layers(model_name, recipe, request, saved, for_load=for_load)[0]

    def resolve_layers(self, model_name: str, recipe: str, request: dict[str, Any] | None = None,
                       saved: dict[str, Any] | None = None, *,
                       for_load: bool = True) -> tuple[dict[str, Any], dict[str, list[str]]]:
        """The effective options and, for each, the layers its value came from (`LAYERS`; several
        for merged `*_args`). Auto-tune fills only what the user left alone: a key given in the
        request, the saved options or the architecture defaults, or set in the config (file, env,
        flags), keeps that value; for `*_args` the profile's flags go under the server-wide ones,
        flag by flag. `for_load`: a saved option that today's checks refuse stops the load with a
        400 saying so (views pass False: they show the options without it)."""
        request = request or {}
        specs = options_for(recipe)
        own = {k: v for k, v in self.model_defaults(model_name).items() if k in specs}
        entry = self.saved(model_name) if saved is None else saved
        saved = self._usable(model_name, recipe, {**own, **entry}, strict=for_load, overridden=set(request))
        arch = self.architecture_options(model_name, recipe)
        effective = self.defaults(recipe)
        layers = {key: ["config" if spec.config_key and self.config.user_set(spec.config_key) else "default"]
                  for key, spec in specs.items()}
        user: dict[str, Any] = {}
        for key in effective:
            if key in request and request[key] is not None:
                user[key], layers[key] = request[key], ["request"]
            elif key in saved and request.get(key, UNSET) is UNSET:
                user[key], layers[key] = saved[key], ["saved" if key in entry else "model"]
        tuned = self._tuned(model_name, recipe, effective, user)
        args_keys = args_options()
        for key, value in tuned.items():
            spec = specs.get(key)
            if key in args_keys or spec is None or (spec.config_key and self.config.user_set(spec.config_key)):
                continue
            effective[key], layers[key] = value, ["auto_tune"]
        for key, value in arch.items():
            if key not in args_keys and key not in user:
                effective[key], layers[key] = value, ["architecture"]
        effective.update(user)
        for args_key, config_key in args_keys.items():
            if args_key in effective:
                effective[args_key], layers[args_key] = self._args(
                    args_key, self._server_args_key(recipe, config_key, effective), request, saved, entry, arch,
                    tuned.get(args_key) or "", bool(effective["merge_args"]))
        return effective, layers

    def _args(self, key: str, config_key: str, request: dict[str, Any], saved: dict[str, Any],
              entry: dict[str, Any], arch: dict[str, Any], tuned: str, merge: bool) -> tuple[str, list[str]]:
        """One `*_args` option and the layers its flags came from. Two scopes, as in Lemonade: the
        model's (the request's flags, else the saved ones over the architecture's) over the server's
        (the admin's `config_key` over the auto-tune profile's)."""
        admin = str(self.config.get(config_key) or "")
        server, server_layers = _layered([(admin, "config" if self.config.user_set(config_key) else "default"),
                                          (tuned, "auto_tune")])
        if key in request and request[key] is not None:
            model, model_layers = str(request[key]), ["request"]
            given = True  # even "": this load asks for no per-model flags
        else:
            mine = saved.get(key) if request.get(key, UNSET) is UNSET else None
            parts = [(str(mine or ""), "saved" if key in entry else "model"),
                     (str(arch.get(key) or ""), "architecture")]
            model, model_layers = _layered(parts if merge else [next((p for p in parts if p[0]), ("", ""))])
            given = bool(model)
        if not merge:  # the highest scope that gives flags, alone
            return (model, model_layers) if given else (server, server_layers or ["default"])
        return _layered([(model, ""), (server, "")])[0], (model_layers + server_layers) or ["default"]

    def _server_args_key(self, recipe: str, config_key: str, effective: dict[str, Any]) -> str:
        """`<section>.<backend>_args` for the backend this load runs on when it holds flags, else
        `<section>.args`. The backend is only worked out when some backend of the engine has flags of
        its own (by default none has: nothing to decide)."""
        section = config_key.rsplit(".", 1)[0]
        variants = [f"{section}.{b}_args" for b in BACKEND_ARGS.get(section, ())]
        if not any(self.config.get(k) for k in variants):
            return config_key
        specific = f"{section}.{self.backend_of(recipe, effective)}_args"
        return specific if specific in variants and self.config.get(specific) else config_key

    def architecture_options(self, model_name: str, recipe: str) -> dict[str, Any]:
        """The architecture defaults of a model's file (`architecture_of`) that its recipe takes. A
        shipped entry is checked like a saved option; a value refused is left out with a warning (never a
        `*_backend`: the file must not choose the backend)."""
        shipped = for_architecture(self.architecture_of(model_name)) if file_format(recipe) == "gguf" else {}
        takes = options_for(recipe)
        out: dict[str, Any] = {}
        for key, value in shipped.items():
            if key not in takes:
                continue  # another recipe's option (an architecture can be served by several)
            try:
                if key.endswith("_backend"):
                    raise OptionsError(f"Option '{key}' is not an architecture default: the backend is chosen by "
                                       "the user and the machine")
                out[key] = validate_option(recipe, key, value)
            except OptionsError as exc:
                log.warning("Architecture default %s of %s skipped: %s", key, model_name, exc)
        return out

    def _tuned(self, model_name: str, recipe: str, effective: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
        """The auto-tune layer for this load: the profile's options for the backend the load will use
        (the user's choice, else the profile's, else the configured default)."""
        if self.tuning is None:
            return {}
        chooser = backend_option(recipe)
        backend = None
        if chooser and chooser in effective:
            spec = options_for(recipe)[chooser]
            if chooser in user:
                backend = user[chooser]
            elif spec.config_key and self.config.user_set(spec.config_key):
                backend = effective[chooser]
            else:
                backend = self.tuning(model_name, recipe, None).get(chooser) or effective[chooser]
        return self.tuning(model_name, recipe, backend)

    @staticmethod
    def _usable(model_name: str, recipe: str, saved: dict[str, Any], *, strict: bool,
                overridden: set[str]) -> dict[str, Any]:
        """Saved values that pass today's checks (values are checked when saved; an entry written
        before a check existed can still fail it). `strict` (a load): such a value is never dropped
        silently; the load is refused, naming it and how to clear it, unless this request gives the
        key a value of its own."""
        out: dict[str, Any] = {}
        for key, value in saved.items():
            try:
                if key != "pinned":  # stored next to the options, not one of them
                    validate_option(recipe, key, value)
            except OptionsError as exc:
                if strict and key not in overridden:
                    raise APIError(400, f"The saved option {key} of {model_name} is not accepted any more, so the "
                                   f"model was not loaded: {exc} Change it or clear it with POST "
                                   f"/v1/models/{model_name}/options {{\"{key}\": null}}, or give {key} in this "
                                   "request.", code="invalid_saved_option") from None
                log.warning("The saved option %s of %s is not accepted any more: %s", key, model_name, exc)
                continue
            out[key] = value
        return out

    def save_from_load(self, model_name: str, request: dict[str, Any], pinned: bool | None) -> None:
        """`save_options: true` on /v1/load: replace the entry; a null keeps the old value."""
        old = self.saved(model_name)
        entry = {k: v for k, v in request.items() if v is not None}
        entry.update({k: old[k] for k, v in request.items() if v is None and k in old})
        if pinned is not None:
            entry["pinned"] = pinned
        self._write(model_name, entry)

    def merge_saved(self, model_name: str, changes: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST /v1/models/{id}/options: merge; null (or "" for `*_args`) removes a key. Returns the
        would-be entry."""
        entry = self.saved(model_name)
        args_keys = args_options()
        for key, value in changes.items():
            if value is None or (key in args_keys and value == ""):  # no flags is no saved flags
                entry.pop(key, None)
            else:
                entry[key] = value
        if not dry_run:
            self._write(model_name, entry)
        return entry

    def reset(self, model_name: str) -> None:
        self._write(model_name, None)
