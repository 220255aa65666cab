"""What an engine says about itself as data: its backends and its config section, key by key.

Each engine folder has a `descriptor.py` with one `Descriptor` (backends/descriptors.py lists them).
The config defaults of its section (config.py), the checks of its keys, the `lemonade serve` flags
(cli/engine_flags.py), the `lemonade load` flags (cli/load_options.py), the engine's load options and
their checks (Engine.__init_subclass__) and the engine's `backends` are all derived from it, as
Lemonade's C++ server derives them from its `BackendDescriptor`, so they cannot drift apart.
A descriptor module imports nothing above config (tests/test_layers.py): config reads it without
importing any engine.

`*_bin` values (which build of a native engine a backend runs) are checked here too: every engine
with `<backend>_bin` keys takes the same kinds of value.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a release tag ("b8664")
AUTO = "auto"  # a backend key's default: the best backend for this machine's devices


def bin_kind(value: str) -> str:
    """"builtin", "latest", "path" or "tag"."""
    if value in ("", "builtin"):
        return "builtin"
    if value == "latest":
        return "latest"
    return "path" if os.path.isabs(value) else "tag"


# A check of a setting's value, of its type already: (the dotted key, its value) -> why it cannot be
# used, or None.
Check = Callable[[str, Any], "str | None"]


@dataclass(frozen=True)
class Setting:
    """One key of an engine's config section besides its backend, args and `*_bin` keys."""

    key: str
    default: Any  # its type is the type a value must have (floats accept ints)
    help: str
    flag: str | None = None  # the `lemonade serve` flag that sets it, without dashes
    choices: tuple[str, ...] = ()  # the values it takes, when a list says it
    check: Check | None = None  # a value that needs more than its type (device names, a picture's size)
    # A value of more than one form (a list, or "auto"): (value, dotted key) -> the value kept; raises
    # ValueError naming what is wrong. `from_text` reads it from an env var's or a flag's text.
    normalize: Callable[[Any, str], Any] | None = None
    from_text: Callable[[str], Any] | None = None
    option: str | None = None  # the load option that sets it for one model (`llamacpp_device`)
    option_help: str = ""  # that option's help, where `help` (the server-wide key's) does not fit one model
    metavar: str = "VALUE"  # what its load flag's help shows for the value (`--llamacpp-device DEVICES`)

    @property
    def option_type(self) -> type | tuple[type, ...]:
        """The JSON types its load option takes: its default's (a float takes an int; a list also its text)."""
        if isinstance(self.default, float):
            return (int, float)
        if isinstance(self.default, list):
            return (list, str)
        return type(self.default)


def check_threads(what: str, value: int) -> str | None:
    """A thread count: 0 lets the engine take one per core."""
    return None if value >= 0 else f"'{what}' must be 0 (one per core) or more, got {value}"


def choices_problem(what: str, value: Any, choices: tuple[str, ...]) -> str | None:
    return None if not choices or value in choices else f"'{what}' must be one of {', '.join(choices)}, got '{value}'"


@dataclass(frozen=True)
class ModelOption:
    """A load option of one engine that no config key sets: a model's own (`fasterwhisper_threads`)."""

    name: str
    type: type | tuple[type, ...]  # the JSON types it takes
    help: str
    metavar: str  # what its load flag's help shows for the value
    default: Any = None  # what the engine uses when it is not given
    choices: tuple[str, ...] = ()  # the values it takes, when a list says it
    check: Check | None = None  # a value that needs more than its type; the name is the key it gets

    def problem(self, value: Any) -> str | None:
        """Why `value` cannot be this option's, beyond its type, or None."""
        problem = choices_problem(self.name, value, self.choices)
        if problem is None and self.check is not None:
            problem = self.check(self.name, value)
        return f"Option {problem}" if problem else None

    @classmethod
    def threads(cls, name: str, help_text: str) -> ModelOption:
        """An engine's thread count for one model: 0 (the default) is one per core."""
        return cls(name, int, help_text, "N", default=0, check=check_threads)


@dataclass(frozen=True)
class BinRule:
    """What an engine's `<backend>_bin` keys take, and the words their refusals use."""

    example_tag: str | None  # a release tag of the engine ("b8664"); None: only "builtin"
    server: str  # the server binary a folder of the user's own build holds ("llama-server")
    only_builtin: str = ""  # why only "builtin" applies, when it does

    def problem(self, key: str, value: str) -> str | None:
        """Why `value` cannot be used for `key`, or None (config validation)."""
        if self.example_tag is None:
            return None if value in ("", "builtin") else \
                f"'{key}' can only be \"builtin\": {self.only_builtin}; got {json.dumps(value)}"
        kind = bin_kind(value)
        if kind == "path" and not os.path.isdir(value):
            return (f"'{key}' path does not exist: {value}. Use \"builtin\", \"latest\", a version tag (e.g. "
                    f"\"{self.example_tag}\"), or a folder holding your own {self.server} build.")
        if kind == "tag" and not TAG_RE.match(value):
            return (f"'{key}' must be \"builtin\", \"latest\", a release tag such as \"{self.example_tag}\", or an "
                    f"absolute path; got {value!r}")
        return None


@dataclass(frozen=True)
class Descriptor:
    """One recipe's engine, as data."""

    recipe: str  # as models name it
    engine_class: str  # the class in the folder's engine.py
    title: str  # how help texts name it ("llama.cpp")
    backends: tuple[str, ...]  # every backend it lists (system-info), in that order
    # What it serves (recipes.py reads it: the catalog's vocabulary): deployment modes, default first;
    # modes it serves only for models that carry a label as well (label -> those modes: a llama.cpp
    # decision model labelled `classification` + `systemone` answers /v1/systemone, llamacpp-newer.md);
    # the weight file format it loads ("gguf": a bare file of it in the extra models dir is its model).
    modes: tuple[str, ...] = ()
    label_modes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    file_format: str | None = None
    section: str | None = None  # its config section ("llamacpp", "sdcpp"), if it has one
    # With a section: a `backend` key (auto or one of `backends`), an `args` key and a `<backend>_args`
    # key per backend (guide-configuration-README.md "Backend Configuration").
    backend_key: bool = False
    args_key: bool = False
    backend_flag: str | None = None  # the `lemonade serve` flag setting `<section>.backend`
    args_flag: str | None = None  # the `lemonade serve` flag setting `<section>.args`
    args_help: str = ""  # what `<section>.args` holds
    args_option_help: str = ""  # what a model's own `<section>_args` load option holds
    settings: tuple[Setting, ...] = ()  # its other keys, in the order config shows them
    model_options: tuple[ModelOption, ...] = ()  # its load options that no config key sets
    # The panel `lemonade load --help` lists its load flags under (guide-cli.md's "Llama.cpp Backend
    # Options"); by default "<title> Options".
    panel: str = ""
    bins: tuple[str, ...] = ()  # backends with a `<backend>_bin` key
    bin_rule: BinRule | None = None

    @property
    def backend_option(self) -> str | None:
        """The load option naming the backend a model runs on, with a `backend` key: `<recipe>_backend`
        (`sd-cpp_backend`, as Lemonade names it)."""
        return f"{self.recipe}_backend" if self.backend_key else None

    @property
    def args_option(self) -> str | None:
        """The load option holding a model's own engine arguments, with an `args` key: `<section>_args`
        (`sdcpp_args`)."""
        return f"{self.section}_args" if self.args_key else None

    @property
    def backend_choices(self) -> tuple[str, ...]:
        """What `<section>.backend` and the `<recipe>_backend` option take."""
        return (AUTO, *self.backends)

    def backend_problem(self, what: str, value: Any) -> str | None:
        """Why `value` is no backend of this engine (for `what`: a config key or an option), or None."""
        return choices_problem(what, value, self.backend_choices)

    @property
    def load_panel(self) -> str:
        return self.panel or f"{self.title} Options"

    def backend_help(self) -> str:
        return f"{self.title} backend: {', '.join(self.backend_choices)} (auto: the best this machine has)"

    def config_defaults(self) -> dict[str, Any]:
        """Its config section with every key at its default."""
        out: dict[str, Any] = {}
        if self.backend_key:
            out["backend"] = AUTO
        if self.args_key:
            out["args"] = ""
        out.update({s.key: copy.deepcopy(s.default) for s in self.settings})  # a list default is not shared
        out.update({f"{backend}_bin": "builtin" for backend in self.bins})
        if self.args_key:
            out.update({f"{backend}_args": "" for backend in self.backends})
        return out

    def setting(self, key: str) -> Setting | None:
        return next((s for s in self.settings if s.key == key), None)

    def problem(self, key: str, value: Any, what: str | None = None) -> str | None:
        """Why `value` cannot be the value of `key` (a key of its section, without the section), beyond
        its type, or None. Messages start with `what` in quotes (by default the dotted key; config adds
        "Config key ", a load option's check "Option ")."""
        dotted = what or f"{self.section}.{key}"
        if key == "backend" and self.backend_key:
            return self.backend_problem(dotted, value)
        if key.endswith("_bin") and self.bin_rule is not None:
            return self.bin_rule.problem(dotted, value)
        setting = self.setting(key)
        if setting is None:
            return None
        if setting.normalize is not None:
            try:
                setting.normalize(value, dotted)
            except ValueError as exc:
                return str(exc)
        problem = choices_problem(dotted, value, setting.choices)
        if problem is not None:
            return problem
        if setting.check is not None:
            return setting.check(dotted, value)
        return None

    def option_check(self, option: str, key: str = "backend") -> Callable[[Any], str | None]:
        """The check of the load option `option` that takes what `<section>.<key>` takes (the
        `<recipe>_backend` option: `backend`)."""

        def check(value: Any) -> str | None:
            problem = self.problem(key, value, option)
            return f"Option {problem}" if problem else None

        return check

    def serve_flags(self) -> dict[str, tuple[str, str]]:
        """`lemonade serve` flag (without dashes) -> (the key of its section it sets, its help)."""
        out: dict[str, tuple[str, str]] = {}
        if self.backend_flag:
            out[self.backend_flag] = ("backend", self.backend_help())
        if self.args_flag:
            out[self.args_flag] = ("args", self.args_help)
        out.update({s.flag: (s.key, s.help) for s in self.settings if s.flag})
        return out
