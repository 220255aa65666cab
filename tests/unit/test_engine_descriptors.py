"""Every engine is a folder of backends/ whose descriptor is the one place its settings are written.

For each engine backends/descriptors.py names: the folder holds `descriptor.py` and `engine.py`, the
engine class is the one the registry serves, and what config, the engine class, `lemonade serve`
and `lemonade load` say about its backends and keys is what the descriptor derives. Config reads the
descriptors without importing any engine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lemonade import config
from lemonade.backends.descriptor import AUTO, Descriptor
from lemonade.backends.descriptors import BY_SECTION, DESCRIPTORS, ENGINES
from lemonade.backends.registry import ENGINE_CLASSES
from lemonade.cli import load_options
from lemonade.cli.engine_flags import engine_flags, with_engine_flags
from lemonade.cli.main import serve
from lemonade.recipes import RECIPES

BACKENDS_DIR = Path(config.__file__).parent / "backends"
NOT_A_BACKEND = "no-such-backend"


def test_each_engine_folder_is_registered_once_and_each_registered_name_is_a_folder():
    folders = sorted(p.parent.name for p in BACKENDS_DIR.glob("*/descriptor.py"))
    assert folders == sorted(ENGINES) and len(set(ENGINES)) == len(ENGINES)
    for name in ENGINES:
        assert (BACKENDS_DIR / name / "engine.py").is_file()
        # config imports the descriptor, and with it the folder's package: it must import nothing
        assert "import" not in (BACKENDS_DIR / name / "__init__.py").read_text()


@pytest.mark.parametrize("name", ENGINES)
def test_the_registry_serves_the_class_the_descriptor_names_with_its_backends(name):
    descriptor = DESCRIPTORS[name]
    engine = next(cls for cls in ENGINE_CLASSES if cls.__module__ == f"lemonade.backends.{name}.engine")
    assert engine.__name__ == descriptor.engine_class
    assert engine.recipe == descriptor.recipe and engine.backends == descriptor.backends
    # what it serves: the catalog's table (recipes.py) and the class both read the descriptor
    recipe = RECIPES[descriptor.recipe]
    assert (recipe.modes, recipe.label_modes, recipe.file_format) == \
        (descriptor.modes, descriptor.label_modes, descriptor.file_format) != ((), {}, None)
    assert (engine.modes, engine.label_modes, engine.file_format) == \
        (descriptor.modes, descriptor.label_modes, descriptor.file_format)


def _engine(descriptor: Descriptor) -> type:
    return next(cls for cls in ENGINE_CLASSES if cls.recipe == descriptor.recipe)


@pytest.mark.parametrize("section", list(BY_SECTION))
def test_config_defaults_and_checks_are_the_descriptors(section):
    descriptor = BY_SECTION[section]
    assert config.DEFAULTS[section] == descriptor.config_defaults()
    assert config.BACKEND_ARGS.get(section) == (descriptor.backends if descriptor.args_key else None)
    # every key of the engine's options that the server-wide layer reads is a key of its section
    engine = _engine(descriptor)
    keys = {opt.config_key for opt in engine.options.values() if opt.config_key and "." in opt.config_key}
    assert keys <= {f"{section}.{key}" for key in descriptor.config_defaults()}
    # the backend and `*_args` options are the descriptor's, not written in the engine class
    assert (engine.backend_option, engine.args_option) == (descriptor.backend_option, descriptor.args_option)
    if descriptor.args_key:
        args = engine.options[engine.args_option]
        assert args.config_key == f"{section}.args" and args.check("") is None
        # a model's own arguments get the engine's check: a flag Lemonade sets itself is refused
        assert "--port" in args.check("--port 1")
    if descriptor.backend_key:
        backend = engine.options[engine.backend_option]
        assert backend.config_key == f"{section}.backend"
        for value in descriptor.backend_choices:
            assert config.validate_value(f"{section}.backend", value) == value and backend.check(value) is None
        with pytest.raises(config.ConfigError) as refused:
            config.validate_value(f"{section}.backend", NOT_A_BACKEND)
        expected = descriptor.backend_problem(f"{section}.backend", NOT_A_BACKEND)
        assert str(refused.value) == f"Config key {expected}"
        option_refusal = descriptor.backend_problem(engine.backend_option, NOT_A_BACKEND)
        assert backend.check(NOT_A_BACKEND) == f"Option {option_refusal}"
    for setting in descriptor.settings:  # a setting's load option is derived from it too
        if setting.option:
            option = engine.options[setting.option]
            assert (option.type, option.config_key) == (setting.option_type, f"{section}.{setting.key}")
            assert option.check(setting.default) is None
            for value in setting.choices:
                assert option.check(value) is None
            if isinstance(setting.default, str):  # a check sees values of the option's type only
                assert option.check(NOT_A_BACKEND) == (f"Option {problem}" if (problem := descriptor.problem(
                    setting.key, NOT_A_BACKEND, setting.option)) else None)
        for value in setting.choices:
            assert config.validate_value(f"{section}.{setting.key}", value) == value


def test_a_server_wide_image_default_is_refused_as_the_load_option_is():
    """`sdcpp.width=100` was taken by config, and every image load then refused the option it gave."""
    descriptor = BY_SECTION["sdcpp"]
    engine = _engine(descriptor)
    for key, bad in (("width", 100), ("height", 4096), ("steps", 101), ("cfg_scale", -1.0)):
        with pytest.raises(config.ConfigError) as refused:
            config.validate_value(f"sdcpp.{key}", bad)
        assert str(refused.value) == f"Config key {descriptor.problem(key, bad)}" and str(bad) in str(refused.value)
        assert engine.options[key].check(bad) == f"Option {descriptor.problem(key, bad, key)}"
    assert config.validate_value("sdcpp.width", 1024) == 1024 and config.validate_value("sdcpp.cfg_scale", 0) == 0.0


def test_bin_sections_are_the_engines_whose_bin_keys_select_a_build():
    assert set(config.BIN_SECTIONS) == {s for s, d in BY_SECTION.items() if d.bins and d.bin_rule
                                        and d.bin_rule.example_tag}
    for section, descriptor in BY_SECTION.items():
        for backend in descriptor.bins:
            assert config.validate_value(f"{section}.{backend}_bin", "builtin") == "builtin"
            with pytest.raises(config.ConfigError, match=f"'{section}.{backend}_bin'"):
                config.validate_value(f"{section}.{backend}_bin", "/no/such/folder")


def test_serve_has_exactly_the_engine_flags_the_descriptors_name_with_their_help():
    command = typer.main.get_command(_app_with(serve))
    ours = {p.opts[0].removeprefix("--"): p.help for p in command.params if p.opts[0].startswith("--")
            and p.opts[0].removeprefix("--").split("-")[0] in BY_SECTION}
    assert ours == {f.flag: f.help for f in engine_flags()}
    assert ours["llamacpp"] == BY_SECTION["llamacpp"].backend_help()  # lists every value config takes


def test_an_engine_flag_sets_its_key_of_the_engines_section():
    seen = {}

    def probe(engines: dict | None = None) -> None:
        seen.update(engines or {})

    result = CliRunner().invoke(_app_with(with_engine_flags(probe)), ["--llamacpp", "vulkan", "--llamacpp-args",
                                                                      "-t 2"])
    assert result.exit_code == 0, result.output
    assert seen == {"llamacpp": {"backend": "vulkan", "args": "-t 2"}}


def _load_options(descriptor: Descriptor) -> dict[str, str]:
    """Every load option the descriptor gives its engine -> the help its `load` flag must show."""
    options = {}
    if descriptor.backend_option:
        options[descriptor.backend_option] = descriptor.backend_help()
    if descriptor.args_option:
        options[descriptor.args_option] = descriptor.args_option_help
    options.update({s.option: s.option_help or s.help for s in descriptor.settings if s.option})
    options.update({o.name: o.help for o in descriptor.model_options})
    return options


@pytest.mark.parametrize("name", ENGINES)
def test_every_load_option_of_an_engine_is_its_descriptors_with_a_load_flag(name):
    descriptor = DESCRIPTORS[name]
    engine = _engine(descriptor)
    derived = _load_options(descriptor)
    assert set(derived) <= set(engine.options)  # the engine takes each one ...
    flags = {f.key: f for f in load_options.FLAGS}
    for option, help_text in derived.items():  # ... and `lemonade load` offers it, in the engine's panel
        assert help_text and flags[option].help == help_text and flags[option].panel == descriptor.load_panel
    if descriptor.backend_key:
        assert all(b in flags[engine.backend_option].help for b in (AUTO, *descriptor.backends))
    for option in descriptor.model_options:  # a model option's default and checks are the engine's
        assert engine.options[option.name].default == option.default and engine.options[option.name].config_key is None


def test_a_load_flag_sends_the_option_its_descriptor_names():
    seen = {}

    def probe(options: dict | None = None) -> None:
        seen.update(options or {})

    result = CliRunner().invoke(_app_with(load_options.with_load_options(probe)), [
        "--whispercpp", "vulkan", "--fasterwhisper-compute-type", "float32", "--piper-threads", "2",
        "--flow-shift", "3", "--rpc-workers", "a:1, b:2", "--llamacpp-device", "Vulkan0"])
    assert result.exit_code == 0, result.output
    assert seen == {"whispercpp_backend": "vulkan", "fasterwhisper_compute_type": "float32", "piper_threads": 2,
                    "flow_shift": 3.0, "rpc_workers": ["a:1", "b:2"], "llamacpp_device": "Vulkan0"}


@pytest.mark.parametrize(("recipe", "option", "bad", "refusal"), [
    ("fasterwhisper", "fasterwhisper_compute_type", "int4", "Option 'fasterwhisper_compute_type' must be one of "
     "int8, int8_float32, float32, default, got 'int4'"),
    ("fasterwhisper", "fasterwhisper_threads", -1, "Option 'fasterwhisper_threads' must be 0 (one per core) or more"),
    ("kokoro", "kokoro_threads", -2, "Option 'kokoro_threads' must be 0 (one per core) or more"),
    ("sd-cpp", "flow_shift", -0.5, "Option 'flow_shift' must be 0 or more, got -0.5"),
])
def test_a_model_option_is_checked_as_its_descriptor_says(recipe, option, bad, refusal):
    check = _engine(next(d for d in DESCRIPTORS.values() if d.recipe == recipe)).options[option].check
    assert check is not None and (check(bad) or "").startswith(refusal)
    good = {"fasterwhisper_compute_type": "int8", "fasterwhisper_threads": 0, "kokoro_threads": 4, "flow_shift": 3.0}
    assert check(good[option]) is None


def test_config_imports_no_engine():
    probe = ("import sys, lemonade.config\n"
             "print([m for m in sys.modules if m.startswith('lemonade.backends.') and m.endswith('.engine')])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def _app_with(command) -> typer.Typer:
    app = typer.Typer()
    app.command()(command)
    return app
