"""The model registry: built-in models, `user.*` registrations, the extra models dir and aliases.

Every API that takes a model name resolves it here, so aliases and the `user.`/`extra.`/`builtin.`
ids (catalog/naming.py) behave the same on every route. A model's `name` is its canonical id; its
`public` id (what listings show) is kept current here whenever the set of models changes. State
files (`user_models.json`, `aliases.json`) are written atomically and re-read only by this class.
"""

from __future__ import annotations

import json
import logging
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from lemonade.catalog import collection_file
from lemonade.catalog.extra_dir import scan_extra_dir
from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.catalog.naming import BUILTIN, EXTRA, PREFIXES, USER, public_ids, reserved_problem, split
from lemonade.checkpoints.local import hub_cache_dir, resolve_local
from lemonade.checkpoints.variants import parse_checkpoint
from lemonade.labels import (
    COLLECTION_RECIPES,
    OMNI_PLACEHOLDERS,
    ROUTER_RECIPE,
    LabelError,
    claimed_modes,
    deployment_mode,
)
from lemonade.model_info import ModelInfo
from lemonade.recipes import file_format
from lemonade.routing.cost import COST_FIELDS, field_problem
from lemonade.routing.policy import PolicyError, member_modes, parse_policy
from lemonade.util.atomic import atomic_write_json, read_json

log = logging.getLogger("lemonade.catalog")
DEFAULT_TAG = ":latest"  # Ollama's tag for "the" version of a model
USER_PREFIX = "user."
LEGACY_LABEL_FLAGS = {"reasoning": "reasoning", "vision": "vision", "embedding": "embeddings",
                      "reranking": "reranking"}
SOURCES = ("huggingface", "modelscope", "local")
LOCAL_PATH = "local_path"  # Lemonade's local imports in user_models.json (_local_path_model)


class RegistrationError(ValueError):
    """An invalid model definition; the message is shown to the user as is."""


def nested_error(collection: str, component: str) -> str:
    return (f"Model '{collection}': component '{component}' is a collection; the components of a collection "
            "must be models, not collections (collections cannot be nested)")


class NotFound(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _builtin_definitions() -> dict[str, dict[str, Any]]:
    text = resources.files("lemonade.catalog").joinpath("resources/server_models.json").read_text()
    return json.loads(text)


def _checkpoints_of(name: str, definition: dict[str, Any]) -> dict[str, str]:
    """Normalise `checkpoint` + `mmproj` + `checkpoints` into role -> checkpoint."""
    out: dict[str, str] = {}
    raw = definition.get("checkpoints") or {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise RegistrationError(f"Model '{name}': 'checkpoints' must be an object of role -> checkpoint strings")
    out.update(raw)
    if definition.get("checkpoint") is not None:
        if not isinstance(definition["checkpoint"], str):
            raise RegistrationError(f"Model '{name}': 'checkpoint' must be a string like 'owner/repo:Q4_K_M'")
        out["main"] = definition["checkpoint"]
    mmproj = definition.get("mmproj")
    if mmproj:
        if not isinstance(mmproj, str):
            raise RegistrationError(f"Model '{name}': 'mmproj' must be a file name string")
        if ":" in mmproj:
            out["mmproj"] = mmproj
        elif "main" in out:
            out["mmproj"] = f"{parse_checkpoint(out['main']).repo}:{mmproj}"
    return out


def _collection_pointer(name: str, definition: dict[str, Any]) -> dict[str, str]:
    """A collection may name, as its `checkpoint`, the repository holding its collection file
    (`<RepoName>.json`, catalog/collection_file.py), as upstream Lemonade's built-ins and `lemonade pull
    <org>/<repo>` registrations do; its components then come from that file when it gives none inline.
    {"main": repo} or {} (an exported file's `"main": ""`)."""
    raw = definition.get("checkpoint")
    if raw is None and isinstance(definition.get("checkpoints"), dict):
        raw = definition["checkpoints"].get("main")
    if not raw:
        return {}
    try:
        pointer = parse_checkpoint(raw)
    except ValueError as exc:
        raise RegistrationError(f"Model '{name}': checkpoint: {exc}") from None
    return {"main": pointer.repo}


def build_model(name: str, definition: dict[str, Any], origin: str, stored: bool = False,
                checkpoint_optional: bool = False) -> ModelInfo:
    """Validate one stored or submitted definition and turn it into a ModelInfo. `stored`: read from
    the admin's user_models.json, where Lemonade's local imports (`source: local_path`) may be.
    `checkpoint_optional`: a definition without a `main` checkpoint is metadata only (`POST
    /v1/models/register`, and what it stored): listed, never downloaded until registered with one."""
    if not isinstance(definition, dict):
        raise RegistrationError(f"Model '{name}': definition must be a JSON object")
    recipe = definition.get("recipe")
    if not isinstance(recipe, str) or not recipe:
        raise RegistrationError(f"Model '{name}': 'recipe' is required (e.g. 'llamacpp')")
    labels = definition.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise RegistrationError(f"Model '{name}': 'labels' must be an array of strings")
    labels = list(dict.fromkeys(labels))
    for flag, label in LEGACY_LABEL_FLAGS.items():
        value = definition.get(flag)
        if value is not None and not isinstance(value, bool):
            raise RegistrationError(f"Model '{name}': '{flag}' must be true or false")
        if value and label not in labels:
            labels.append(label)
    try:
        mode = deployment_mode(name, recipe, labels)
    except LabelError as exc:
        raise RegistrationError(str(exc)) from None
    if origin == "user" and recipe not in COLLECTION_RECIPES:
        # guide-configuration-custom-models.md: `custom` is added, and the recipe's deployment label when
        # the entry names none (`chat` for llamacpp, `image` for sd-cpp), as Lemonade's registry does.
        labels = ["custom", *(x for x in labels if x != "custom")]
        if not claimed_modes(labels):
            labels.append(mode)
    source = definition.get("source") or "huggingface"
    if source == LOCAL_PATH and stored and recipe not in COLLECTION_RECIPES:
        return _local_path_model(name, definition, recipe, mode, labels)
    if source not in SOURCES:
        raise RegistrationError(f"Model '{name}': Unsupported model source '{source}': 'source' must be "
                                "'huggingface' or 'modelscope'")
    components = definition.get("components")
    if definition.get("routing") is not None and recipe != ROUTER_RECIPE:
        raise RegistrationError(f"Model '{name}': only '{ROUTER_RECIPE}' models take 'routing' (a routing policy)")
    if recipe in COLLECTION_RECIPES:
        checkpoints = _collection_pointer(name, definition)
        if not (components is None and checkpoints) and (
                not isinstance(components, list) or not components
                or not all(isinstance(c, str) and c for c in components)):
            raise RegistrationError(f"Model '{name}': a collection needs 'components', a non-empty array of "
                                    "model names")
        if recipe == ROUTER_RECIPE:
            try:
                parse_policy(definition)
            except PolicyError as exc:
                raise RegistrationError(f"Model '{name}': {exc}") from None
        prompt = definition.get("system_prompt")
        if prompt is not None and (not isinstance(prompt, str) or not all(p in prompt for p in OMNI_PLACEHOLDERS)):
            raise RegistrationError(f"Model '{name}': 'system_prompt' must be a string containing both "
                                    + " and ".join(OMNI_PLACEHOLDERS) + " (the server fills in the tools there)")
    else:
        if components is not None:
            raise RegistrationError(f"Model '{name}': only collection recipes take 'components'")
        checkpoints = _checkpoints_of(name, definition)
        if "main" not in checkpoints and (checkpoints or not (checkpoint_optional or stored)):
            raise RegistrationError(f"Model '{name}': a 'checkpoint' (or a 'main' entry in 'checkpoints') is "
                                    "required, e.g. 'owner/repo:Q4_K_M'")
        for role, ckpt in checkpoints.items():
            try:
                parse_checkpoint(ckpt)
            except ValueError as exc:
                raise RegistrationError(f"Model '{name}': checkpoint '{role}': {exc}") from None
    architecture = definition.get("architecture")
    if architecture is not None and (not isinstance(architecture, str) or not architecture):
        raise RegistrationError(f"Model '{name}': 'architecture' must be a GGUF architecture name such as 'qwen3'")
    size = definition.get("size")
    return ModelInfo(
        name=name, recipe=recipe, mode=mode, checkpoints=checkpoints, labels=labels,
        size=float(size) if isinstance(size, (int, float)) and not isinstance(size, bool) else None,
        suggested=bool(definition.get("suggested", origin == "builtin")), source=source, origin=origin,
        image_defaults=definition.get("image_defaults"), components=components,
        definition=dict(definition),
    )


def _local_path_model(name: str, definition: dict[str, Any], recipe: str, mode: str,
                      labels: list[str]) -> ModelInfo:
    """A model Lemonade imported from files on this machine (`source: local_path`, each checkpoint an
    absolute file path), as its user_models.json holds them. Nothing is downloaded for it: it counts as
    downloaded when every file is there. Only the stored file may name such paths; a `/v1/pull` body
    may not (an API client must not make the server read arbitrary files as a model)."""
    checkpoints = _checkpoints_of(name, definition)
    if "main" not in checkpoints:
        raise RegistrationError(f"Model '{name}': a local model needs a 'checkpoint' (or a 'main' entry in "
                                "'checkpoints'): the absolute path of its file")
    relative = [c for c in checkpoints.values() if not Path(c).is_absolute()]
    if relative:
        raise RegistrationError(f"Model '{name}': a 'local_path' model's checkpoints must be absolute file paths "
                                f"(got {relative[0]!r})")
    return ModelInfo(name=name, recipe=recipe, mode=mode, checkpoints=checkpoints, labels=labels,
                     source="local", origin="user", definition=dict(definition),
                     local_files={role: [Path(path)] for role, path in checkpoints.items()})


class Catalog:
    def __init__(self, config_dir: Path, extra_models_dir: str = "", models_dir: str = "") -> None:
        """`config_dir`: where `user_models.json` and `aliases.json` live (lemonade.paths)."""
        self.user_file = Path(config_dir) / "user_models.json"
        self.alias_file = Path(config_dir) / "aliases.json"
        self.extra_models_dir = extra_models_dir
        self.models_dir = models_dir
        self._lock = threading.RLock()
        self._builtin: dict[str, ModelInfo] = {}
        for name, definition in _builtin_definitions().items():
            model = build_model(PREFIXES[BUILTIN] + name, definition, "builtin")
            self._builtin[model.name] = model
        self._builtin_lower = {m.bare.lower(): m for m in self._builtin.values()}
        self._user: dict[str, ModelInfo] = {}
        self._extra: dict[str, ModelInfo] = {}
        self._extra_hidden: dict[str, str] = {}  # old or folder names of extra models -> canonical id
        self._aliases: dict[str, str] = {}
        # Models served elsewhere (cloud providers), by source: "<provider>.<model>" names of their own,
        # published and withdrawn by their engine (backends/cloud/engine.py), never written here.
        self._remote: dict[str, dict[str, ModelInfo]] = {}
        self._load_user()
        self._load_aliases()
        self.rescan_extra()
        self._adopt_collection_files()

    # ----- state files -------------------------------------------------------------------------
    def _load_user(self) -> None:
        try:
            raw = read_json(self.user_file, {})
        except (OSError, ValueError) as exc:
            log.error("Cannot read %s (%s); user models are unavailable until it is fixed", self.user_file, exc)
            raw = {}
        self._user = {}
        for key, definition in (raw.items() if isinstance(raw, dict) else []):
            name = USER_PREFIX + key.removeprefix(USER_PREFIX)
            try:
                self._user[name] = build_model(name, definition, "user", stored=True)
            except RegistrationError as exc:
                log.error("Skipping invalid entry in %s: %s (the file is left untouched; fix it by hand)",
                          self.user_file, exc)

    def _write_user(self, user: dict[str, ModelInfo]) -> None:
        # Keep entries we could not parse exactly as they are on disk.
        try:
            on_disk = read_json(self.user_file, {})
        except ValueError:
            on_disk = {}
        out = {k: v for k, v in on_disk.items() if USER_PREFIX + k.removeprefix(USER_PREFIX) not in self._user}
        for name, model in user.items():
            out[name.removeprefix(USER_PREFIX)] = model.definition
        atomic_write_json(self.user_file, out)

    def _load_aliases(self) -> None:
        raw = read_json(self.alias_file, {})
        self._aliases = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def rescan_extra(self) -> None:
        root = Path(self.extra_models_dir).expanduser() if self.extra_models_dir else None
        found = scan_extra_dir(root) if root else []
        with self._lock:
            # The same model as before stays the same object: a loaded model keeps its current id.
            self._extra = {m.name: (self._extra[m.name] if m.name in self._extra and
                                    self._extra[m.name].local_files == m.local_files else m) for m in found}
            self._extra_hidden = {h: m.name for m in found for h in m.hidden_names}
            self._reindex()

    def _reindex(self) -> None:
        """Recompute every model's public id after the set of models changed."""
        models = [*self._builtin.values(), *self._user.values(), *self._extra.values()]
        shown = public_ids((m.name for m in models), (m.name for m in models if m.is_collection),
                           (h for h in self._extra_hidden if h.startswith(PREFIXES[EXTRA])))
        for m in models:
            m.public = shown[m.name]

    def set_dirs(self, extra_models_dir: str | None = None, models_dir: str | None = None) -> None:
        if models_dir is not None:
            self.models_dir = models_dir
            self._adopt_collection_files()
        if extra_models_dir is not None:
            self.extra_models_dir = extra_models_dir
            self.rescan_extra()

    def set_remote(self, source: str, models: list[ModelInfo]) -> None:
        """Publish the models one remote source serves now (an empty list withdraws them)."""
        with self._lock:
            if models:
                self._remote[source] = {m.name: m for m in models}
            else:
                self._remote.pop(source, None)

    def remote_models(self, source: str) -> list[ModelInfo]:
        with self._lock:
            return list(self._remote.get(source, {}).values())

    # ----- lookup ------------------------------------------------------------------------------
    def all(self, rescan: bool = True) -> list[ModelInfo]:
        if rescan:
            self.rescan_extra()
        with self._lock:
            return list(self._builtin.values()) + list(self._user.values()) + list(self._extra.values()) + \
                [m for models in self._remote.values() for m in models.values()]

    def _lookup(self, name: str) -> ModelInfo | None:
        """A model by id: `user.X`, `extra.X`, `builtin.X` only ever mean that source's model; a bare
        name means its precedence winner (registered > imported > built-in). Built-in names also
        match case-insensitively, as Lemonade's do."""
        origin, bare = split(name)
        with self._lock:
            if origin == USER:
                return self._user.get(name)
            if origin == EXTRA:
                return self._extra.get(name) or self._extra.get(self._extra_hidden.get(name, ""))
            if origin == BUILTIN:
                return self._builtin.get(name) or self._builtin_lower.get(bare.lower())
            return (self._user.get(PREFIXES[USER] + name) or self._extra.get(PREFIXES[EXTRA] + name)
                    or self._extra.get(self._extra_hidden.get(PREFIXES[EXTRA] + name, ""))
                    or self._builtin.get(PREFIXES[BUILTIN] + name) or self._builtin_lower.get(name.lower())
                    or self._remote_lookup(name))

    def _remote_lookup(self, name: str) -> ModelInfo | None:
        source = self._remote.get(name.split(".", 1)[0]) if "." in name else None
        return source.get(name) if source else None

    def find(self, name: str) -> ModelInfo | None:
        """Resolve a name as any API receives it: a model id (bare or prefixed), else an alias, with
        or without Ollama's default `:latest` tag. Model ids win over aliases (an alias cannot be
        created over a model's name, but a model may appear later under an alias's name)."""
        if not isinstance(name, str) or not name:
            return None
        model = self._lookup(name)
        if model is None and name in self._aliases:
            model = self._lookup(self._aliases[name])
        if model is None and name.startswith(PREFIXES[EXTRA]):  # a file that appeared since the last scan
            self.rescan_extra()
            model = self._lookup(name)
        if model is None and name.endswith(DEFAULT_TAG):  # Ollama's habit: `MODEL:latest` is MODEL
            return self.find(name[: -len(DEFAULT_TAG)])
        return model

    def canonical_key(self, key: str) -> str | None:
        """The canonical id an old-style `recipe_options.json` key stands for, None when it is not an
        old form: a bare built-in name (older Lemonade) or a hidden extra name (older ids here)."""
        origin, _ = split(key)
        with self._lock:
            if origin is None and PREFIXES[BUILTIN] + key in self._builtin:
                return PREFIXES[BUILTIN] + key
            if origin == EXTRA and key not in self._extra and key in self._extra_hidden:
                return self._extra_hidden[key]
        return None

    def resolve(self, name: str) -> ModelInfo:
        model = self.find(name)
        if model is None:
            raise NotFound(name)
        return model

    # ----- registration ------------------------------------------------------------------------
    def validate_registration(self, body: dict[str, Any], checkpoint_optional: bool = False) -> ModelInfo:
        name = body.get("model_name")
        if not isinstance(name, str) or not name.strip():
            raise RegistrationError("'model_name' is required, e.g. 'user.My-Model-GGUF'")
        problem = reserved_problem(name)
        if problem:
            raise RegistrationError(problem)
        if not name.startswith(USER_PREFIX) or name == USER_PREFIX:
            raise RegistrationError(f"Model '{name}': new models must use the 'user.' namespace, e.g. "
                                    f"'user.{name}'")
        if any(c in name for c in "/\\") or name.strip() != name:
            raise RegistrationError(f"Model '{name}': a model name cannot contain slashes or surrounding spaces")
        keys = ("checkpoint", "checkpoints", "recipe", "labels", "source", "components", "mmproj", "size",
                "reasoning", "vision", "embedding", "reranking", "image_defaults", "suggested",
                "version", "routing", "system_prompt", *COST_FIELDS)
        definition = {k: body[k] for k in keys if k in body and body[k] is not None}
        for key in COST_FIELDS:  # what a router decision reports this model costs (routing/cost.py)
            problem = field_problem(key, definition[key]) if key in definition else None
            if problem:
                raise RegistrationError(f"Model '{name}': {problem}")
        return build_model(name, definition, "user", checkpoint_optional=checkpoint_optional)

    def register(self, body: dict[str, Any], one_definition: bool = False) -> ModelInfo:
        """Validate and store a `user.*` definition (and a collection's embedded `models`).
        `one_definition` (`POST /v1/models/register`): exactly one definition, which may lack a
        checkpoint; embedded `models` are a collection import's, refused."""
        if one_definition and "models" in body:
            raise RegistrationError("'models' embeds more model definitions, which this endpoint does not take (one "
                                    "definition per call): register each component first, or import the collection "
                                    "file with /v1/pull")
        model = self.validate_registration(body, checkpoint_optional=one_definition)
        embedded = body.get("models")
        new_components: dict[str, ModelInfo] = {}
        if model.is_collection and model.checkpoints.get("main"):
            # A registry-backed collection is stored as its pointer only, as Lemonade stores it: the
            # components are what its file lists at each pull, never a copy that could go stale.
            for key in ("components", "models"):
                model.definition.pop(key, None)
            model.components = embedded = None
        if model.is_collection and model.components is not None:
            if embedded is not None and not isinstance(embedded, list):
                raise RegistrationError(f"Model '{model.name}': 'models' must be an array of model definitions")
            by_name: dict[str, dict[str, Any]] = {}
            for item in embedded or []:
                if not isinstance(item, dict) or not isinstance(item.get("model_name") or item.get("id"), str):
                    raise RegistrationError(f"Model '{model.name}': each entry of 'models' needs a 'model_name'")
                by_name[item.get("model_name") or item["id"]] = item
            for comp in model.components or []:
                if comp == model.name or comp == model.name.removeprefix(USER_PREFIX):
                    raise RegistrationError(f"Model '{model.name}': a collection cannot reference itself "
                                            f"(component '{comp}')")
                existing = self.find(comp)
                if existing is not None:
                    if existing.is_collection:
                        raise RegistrationError(nested_error(model.name, comp))
                    continue
                if comp not in by_name:
                    raise RegistrationError(f"Model '{model.name}': component '{comp}' is not registered and "
                                            "'models' has no matching definition for it")
                definition = dict(by_name[comp])
                definition["model_name"] = comp if comp.startswith(USER_PREFIX) else USER_PREFIX + comp
                if definition.get("recipe") in COLLECTION_RECIPES:
                    raise RegistrationError(nested_error(model.name, comp))
                if not definition.get("recipe") or not (definition.get("checkpoint") or definition.get("checkpoints")):
                    raise RegistrationError(f"Model '{model.name}': 'models' has an incomplete definition for "
                                            f"component '{comp}': it needs a 'recipe' and a 'checkpoint' (or "
                                            "'checkpoints')")
                comp_model = self.validate_registration(definition)
                new_components[comp_model.name] = comp_model
            model.components = [c if self.find(c) or c not in by_name or c.startswith(USER_PREFIX)
                                else USER_PREFIX + c for c in model.components or []]
            model.definition["components"] = model.components
        if model.recipe == ROUTER_RECIPE:
            self._check_router_members(model, new_components)
        with self._lock:
            user = dict(self._user)
            user.update(new_components)
            user[model.name] = model
            self._write_user(user)
            self._user = user
            self._reindex()
        return model

    def _check_router_members(self, model: ModelInfo, new: dict[str, ModelInfo]) -> None:
        """Each model a routing policy calls must serve what it is called for: candidates answer chat
        requests, classifiers their kind (routing/policy.py `member_modes`)."""
        for field_path, name, modes in member_modes(parse_policy(model.definition)):
            member = self.find(name) or new.get(name) or new.get(USER_PREFIX + name)
            if member is None:
                raise RegistrationError(f"Model '{model.name}': {field_path} '{name}' is not a registered model")
            if member.is_collection or member.mode not in modes:
                kind = "collection" if member.is_collection else f"model of mode '{member.mode}'"
                raise RegistrationError(f"Model '{model.name}': {field_path} '{name}' is a {kind}; it must be a "
                                        f"model of mode {' or '.join(repr(m) for m in modes)}")

    def unregister(self, name: str) -> None:
        with self._lock:
            if name not in self._user:
                return
            user = {k: v for k, v in self._user.items() if k != name}
            on_disk = read_json(self.user_file, {})
            on_disk.pop(name.removeprefix(USER_PREFIX), None)
            on_disk.pop(name, None)
            atomic_write_json(self.user_file, {k: v for k, v in on_disk.items()})
            self._user = user
            self._reindex()

    # ----- registry-backed collections (catalog/collection_file.py) ------------------------------
    def _adopt_collection_files(self) -> None:
        """Components of the registry-backed collections whose file an earlier pull left in the cache."""
        for model in [*self._builtin.values(), *self._user.values()]:
            if model.components is None and collection_file.file_checkpoint(model):
                try:
                    self.adopt_collection_file(model, register=False)
                except (collection_file.CollectionFileError, RegistrationError) as exc:
                    log.error("Collection %s: %s (pull it again to fetch a good copy)", model.public, exc)

    def collection_file(self, model: ModelInfo) -> ModelInfo | None:
        """The file a pull of `model` fetches first: a registry-backed collection's definition, while
        its components are unknown (once adopted, the components are what a pull fetches)."""
        if model.components is None and collection_file.file_checkpoint(model):
            return collection_file.file_model(model)
        return None

    def pointer_file(self, model: ModelInfo) -> ModelInfo | None:
        """A registry-backed collection's file, whether or not its components are known yet: what a pull
        fetches again, so a changed file (components added or removed) is what the collection lists."""
        return collection_file.file_model(model) if collection_file.file_checkpoint(model) else None

    def adopt_collection_file(self, model: ModelInfo, register: bool = True) -> bool:
        """Take a registry-backed collection's components from its pulled file; with `register`, the
        components this server does not know become `user.*` models defined by the file (in the
        collection's registry unless they name their own). False when the file is not on disk; a bad
        file raises CollectionFileError or RegistrationError (both ValueErrors, which a pull reports)."""
        checkpoint = collection_file.file_checkpoint(model)
        found = resolve_local(self.hub_cache(), checkpoint, model.source) if checkpoint else None
        if found is None:
            return False
        data = collection_file.read_file(found[1][0])
        names: list[str] = []
        for comp in data["components"]:
            bare = comp.removeprefix(USER_PREFIX)
            known = self.find(comp) or self.find(USER_PREFIX + bare)
            if known is None and register:
                definition = data["definitions"].get(comp) or data["definitions"].get(bare)
                if definition is None:
                    raise RegistrationError(f"Collection {model.public}: its file names the component '{comp}' "
                                            "but does not define it")
                if definition.get("recipe") in COLLECTION_RECIPES:
                    raise RegistrationError(f"Collection {model.public}: component '{comp}' is a collection; "
                                            "collections cannot be nested")
                known = self.register({"source": model.source, **definition, "model_name": USER_PREFIX + bare})
            names.append(comp if known is None or self.find(comp) is known else USER_PREFIX + bare)
        with self._lock:
            model.components = names
        return True

    # ----- aliases -----------------------------------------------------------------------------
    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def alias_of(self, name: str) -> ModelInfo | None:
        """The model `name` points at when it is used as an alias (no model has that id), else None."""
        if name not in self._aliases or self._lookup(name) is not None:
            return None
        return self._lookup(self._aliases[name])

    def set_alias(self, alias: str, target: str) -> None:
        if not alias or not isinstance(alias, str) or alias.strip() != alias or "/" in alias:
            raise RegistrationError("'alias' must be a non-empty name without slashes or surrounding spaces")
        if split(alias)[0] is not None:
            raise RegistrationError(f"'alias' cannot start with a model id prefix ('user.', 'extra.', 'builtin.'): "
                                    f"'{alias}' would read as a model id")
        if self._lookup(alias) is not None:
            raise RegistrationError(f"'{alias}' is already a model name; choose another alias")
        if self._lookup(self._aliases.get(target, target)) is None:
            raise RegistrationError(f"Alias target '{target}' is not a known model. Run `lemonade list` to see "
                                    "model names.")
        target = self._aliases.get(target, target)
        with self._lock:
            aliases = dict(self._aliases)
            aliases[alias] = target
            atomic_write_json(self.alias_file, aliases)
            self._aliases = aliases

    def remove_alias(self, alias: str) -> bool:
        with self._lock:
            if alias not in self._aliases:
                return False
            aliases = {k: v for k, v in self._aliases.items() if k != alias}
            atomic_write_json(self.alias_file, aliases)
            self._aliases = aliases
            return True

    # ----- files on disk -----------------------------------------------------------------------
    def hub_cache(self) -> Path:
        return hub_cache_dir(self.models_dir)

    def local_files(self, model: ModelInfo) -> dict[str, list[Path]] | None:
        """role -> files for a fully downloaded model, None when anything is missing."""
        if model.local_files is not None:
            return model.local_files if all(f.exists() for fs in model.local_files.values() for f in fs) else None
        if model.is_collection or model.metadata_only:
            return None
        cache = self.hub_cache()
        out: dict[str, list[Path]] = {}
        for role, ckpt in model.file_checkpoints.items():
            found = resolve_local(cache, ckpt, model.source)
            if found is None:
                return None
            out[role] = found[1]
        return out

    def is_downloaded(self, model: ModelInfo) -> bool:
        if model.is_collection:  # a registry-backed one lists no components before its file is pulled
            comps = [self.find(c) for c in model.components or []]
            return bool(comps) and all(c is not None and self.is_downloaded(c) for c in comps)
        return self.local_files(model) is not None

    def max_context_window(self, model: ModelInfo, files: dict[str, list[Path]] | None) -> int | None:
        if file_format(model.recipe) != "gguf" or not files or not files.get("main"):
            return None
        try:
            return gguf_info(files["main"][0]).context_length
        except (OSError, GGUFError):
            return None
