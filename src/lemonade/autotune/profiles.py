"""Auto-tune profiles: their JSON schema, validation, and the bundled set.

A profile maps one archetype id to performance options, per recipe and backend, with optional
per-model overlays (auto-tune.md, phase 1). The schema is backend-agnostic: option names and values
are the recipes' own (`llamacpp_args`, `ctx_size`, ...), checked by the same rules as a `/v1/load`
request, so a profile can say nothing a user could not.

    {
      "schema_version": 1,
      "archetype": "cpu-x86_64-avx512-2c",
      "description": "what machines this is for",
      "source": "how the values were found (measured where, or hand-curated from where)",
      "recipes": {
        "llamacpp": {
          "defaults": {"*": {...options for any backend...}, "cpu": {...for the cpu backend...}},
          "models": {"MODEL_NAME": {"cpu": {...}}}
        }
      }
    }

Only performance options are allowed (the recipe's engine options; residency options such as
`evict_idle_timeout` belong to the user). The backend option itself (e.g. `llamacpp_backend`) may
only appear under "*": it chooses the backend, so it cannot depend on it.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lemonade.backends.registry import args_options, recipe_modes, recipe_options
from lemonade.backends.tuning import backend_option, backends_of

log = logging.getLogger("lemonade.autotune")
SCHEMA_VERSION = 1
ANY_BACKEND = "*"
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
TOP_KEYS = {"schema_version", "archetype", "description", "source", "recipes"}
BUNDLED = resources.files("lemonade.autotune").joinpath("profiles")


class ProfileError(ValueError):
    """A profile that does not follow the schema; the message names the file and the field."""


@dataclass(frozen=True)
class Profile:
    archetype: str
    description: str
    source: str
    recipes: dict[str, dict[str, Any]]
    origin: str  # the file it came from ("bundled:NAME.json" or a path)

    def block(self, recipe: str, backend: str | None, model_names: tuple[str, ...] = ()) -> tuple[dict[str, Any],
                                                                                                   bool]:
        """Options for this recipe and backend: the archetype defaults ("*" then the backend's), with
        the first matching model overlay on top. Returns (options, whether an overlay applied)."""
        spec = self.recipes.get(recipe)
        if not spec:
            return {}, False
        layers = [spec.get("defaults", {}).get(ANY_BACKEND, {}), spec.get("defaults", {}).get(backend or "", {})]
        overlay = next((spec["models"][n] for n in model_names if n in spec.get("models", {})), None)
        if overlay is not None:
            layers += [overlay.get(ANY_BACKEND, {}), overlay.get(backend or "", {})]
        out: dict[str, Any] = {}
        for layer in layers:
            out.update(_stack(out, layer))
        return out, overlay is not None


def _stack(below: dict[str, Any], above: dict[str, Any]) -> dict[str, Any]:
    """`above` over `below`; `*_args` are merged flag by flag (an overlay's `-np 8` keeps the
    defaults' `-t 2`)."""
    from lemonade.runtime.options import merge_args

    args = args_options()
    return {k: merge_args(below[k], v) if k in args and below.get(k) else v for k, v in above.items()}


def _fail(origin: str, where: str, problem: str) -> ProfileError:
    return ProfileError(f"Auto-tune profile {origin}: {where}: {problem}")


def _check_options(origin: str, where: str, recipe: str, backend: str, options: Any) -> dict[str, Any]:
    from lemonade.runtime.options import OptionsError, validate_option

    if not isinstance(options, dict):
        raise _fail(origin, where, f"must be an object of options, got {json.dumps(options)[:80]}")
    allowed = recipe_options(recipe)
    chooser = backend_option(recipe)
    for key, value in options.items():
        if key not in allowed:
            raise _fail(origin, f"{where}.{key}", f"not a performance option of recipe '{recipe}' "
                        f"(allowed: {', '.join(sorted(allowed)) or 'none'})")
        if key == chooser and backend != ANY_BACKEND:
            raise _fail(origin, f"{where}.{key}", f"the backend can only be chosen under \"{ANY_BACKEND}\"")
        if value is None:
            raise _fail(origin, f"{where}.{key}", "must have a value (null is not allowed in a profile)")
        try:
            validate_option(recipe, key, value)
        except OptionsError as exc:
            raise _fail(origin, f"{where}.{key}", str(exc)) from None
    return dict(options)


def _check_backends(origin: str, where: str, recipe: str, section: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(section, dict):
        raise _fail(origin, where, "must be an object of backend name -> options")
    known = backends_of(recipe)
    out = {}
    for backend, options in section.items():
        if backend != ANY_BACKEND and backend not in known:
            raise _fail(origin, f"{where}.{backend}", f"unknown backend of recipe '{recipe}' "
                        f"(known: {ANY_BACKEND}, {', '.join(known)})")
        out[backend] = _check_options(origin, f"{where}.{backend}", recipe, backend, options)
    return out


def validate(data: Any, origin: str = "<profile>") -> Profile:
    """A Profile from parsed JSON, or ProfileError naming the first problem."""
    if not isinstance(data, dict):
        raise _fail(origin, "top level", "must be a JSON object")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _fail(origin, sorted(unknown)[0], f"unknown field (fields: {', '.join(sorted(TOP_KEYS))})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise _fail(origin, "schema_version", f"must be {SCHEMA_VERSION}, got {json.dumps(data.get('schema_version'))}")
    archetype = data.get("archetype")
    if not isinstance(archetype, str) or not ID_RE.match(archetype):
        raise _fail(origin, "archetype", "must be an archetype id: lower-case letters, digits, '-', '_' and '.', "
                    f"e.g. \"cpu-x86_64-avx2-8c\"; got {json.dumps(archetype)}")
    for key in ("description", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise _fail(origin, key, "must be a non-empty string (say what machines it is for / how the values "
                        "were found)")
    recipes = data.get("recipes")
    if not isinstance(recipes, dict) or not recipes:
        raise _fail(origin, "recipes", "must be a non-empty object of recipe name -> settings")
    checked: dict[str, dict[str, Any]] = {}
    for recipe, spec in recipes.items():
        where = f"recipes.{recipe}"
        if recipe not in recipe_modes():
            raise _fail(origin, where, f"unknown recipe (known: {', '.join(sorted(recipe_modes()))})")
        if not isinstance(spec, dict) or not spec or set(spec) - {"defaults", "models"}:
            raise _fail(origin, where, "must be an object with \"defaults\" and/or \"models\"")
        entry: dict[str, Any] = {}
        if "defaults" in spec:
            entry["defaults"] = _check_backends(origin, f"{where}.defaults", recipe, spec["defaults"])
        if "models" in spec:
            if not isinstance(spec["models"], dict):
                raise _fail(origin, f"{where}.models", "must be an object of model name -> backend options")
            entry["models"] = {name: _check_backends(origin, f"{where}.models.{name}", recipe, section)
                               for name, section in spec["models"].items()}
        checked[recipe] = entry
    return Profile(archetype=archetype, description=data["description"], source=data["source"],
                   recipes=checked, origin=origin)


def load_file(path: Path, origin: str | None = None) -> Profile:
    origin = origin or str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProfileError(f"Auto-tune profile {origin}: cannot be read as JSON: {exc}") from None
    profile = validate(data, origin)
    stem = Path(path).name.removesuffix(".json")
    if stem != profile.archetype:
        raise _fail(origin, "archetype", f"is \"{profile.archetype}\" but the file is named {Path(path).name} "
                    f"(name it {profile.archetype}.json)")
    return profile


def load_all(local_dir: Path | None = None) -> tuple[dict[str, Profile], list[str]]:
    """The bundled profiles, then the local folder's (a local profile replaces a bundled one of the
    same archetype). A bad file is skipped and its error returned, never fatal to the server."""
    profiles: dict[str, Profile] = {}
    errors: list[str] = []
    sources: list[tuple[Path, str]] = []
    for item in sorted(BUNDLED.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            sources.append((Path(str(item)), f"bundled:{item.name}"))
    if local_dir is not None and Path(local_dir).is_dir():
        sources += [(p, str(p)) for p in sorted(Path(local_dir).glob("*.json"))]
    for path, origin in sources:
        try:
            profile = load_file(path, origin)
        except ProfileError as exc:
            log.error("%s", exc)
            errors.append(str(exc))
            continue
        profiles[profile.archetype] = profile
    return profiles, errors
