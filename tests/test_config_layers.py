"""The layers of lemonade/config.py (guide-configuration-README.md "Defaults Precedence & Layering"):
built-in defaults < distro defaults.json < LEMONADE_DEFAULTS_PATH < config.json < environment <
flags < POST /v1/params, with config.json a sparse file of what the user set. No server needed."""

from __future__ import annotations

import json

import pytest

from lemonade.catalog.catalog import Catalog
from lemonade.catalog.fit import memory_budget, too_big
from lemonade.config import DEFAULTS, Config, ConfigError, layered_defaults
from lemonade.system.devices import CpuFacts, DeviceReport, Gpu, detect_devices, memory_use


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_each_layer_wins_over_the_one_below(tmp_path):
    system = write(tmp_path / "usr-share" / "defaults.json",
                   {"max_loaded_models": 2, "llamacpp": {"backend": "cpu"}, "ctx_size": 1024, "port": 9001})
    packager = write(tmp_path / "nix" / "defaults.json", {"max_loaded_models": 3, "ctx_size": 2048})
    write(tmp_path / "conf" / "config.json", {"ctx_size": 4096, "global_timeout": 30})
    env = {"LEMONADE_DEFAULTS_PATH": str(packager), "LEMONADE_GLOBAL_TIMEOUT": "45"}
    defaults = layered_defaults(env, system_path=system)
    assert defaults["llamacpp"]["backend"] == "cpu"  # distro
    assert defaults["max_loaded_models"] == 3 and defaults["ctx_size"] == 2048  # packager over distro
    assert defaults["llamacpp"]["args"] == ""  # a nested key it does not name keeps the built-in value

    config = Config(tmp_path / "conf", cli_overrides={"port": 9002}, environ=env)
    assert config.get("ctx_size") == 4096  # config.json over every defaults file
    assert config.get("global_timeout") == 45  # environment over config.json
    assert config.get("port") == 9002  # flag over everything persisted
    assert not config.user_set("max_loaded_models") and config.user_set("ctx_size")
    config.set_runtime({"ctx_size": 8192})  # /v1/params over all of them, never written
    assert config.get("ctx_size") == 8192
    assert json.loads(config.path.read_text()) == {"ctx_size": 4096, "global_timeout": 30}


def test_config_json_holds_only_what_was_set(tmp_path):
    config = Config(tmp_path, environ={})
    config.set({"max_loaded_models": 2})
    config.set({"llamacpp": {"args": "--threads 2"}})
    assert json.loads(config.path.read_text()) == {"max_loaded_models": 2, "llamacpp": {"args": "--threads 2"}}
    # Everything else follows the defaults, including ones a later version changes.
    assert Config(tmp_path, environ={}).get("global_timeout") == DEFAULTS["global_timeout"]


def test_unknown_and_invalid_keys_in_files_are_skipped_and_named(tmp_path):
    defaults = write(tmp_path / "defaults.json", {"acestep": {"backend": "auto"}, "max_loaded_models": 2})
    write(tmp_path / "config.json", {"port": "eighty", "offline": True, "no_such": 1})
    config = Config(tmp_path, environ={"LEMONADE_DEFAULTS_PATH": str(defaults)})
    assert config.get("max_loaded_models") == 2 and config.get("offline") is True
    assert config.get("port") == DEFAULTS["port"]
    assert any("acestep.backend" in n for n in config.notes)
    assert any("port (" in n and "no_such" in n for n in config.notes)


def test_a_missing_defaults_path_is_a_note_not_an_error(tmp_path):
    config = Config(tmp_path, environ={"LEMONADE_DEFAULTS_PATH": str(tmp_path / "nope.json")})
    assert config.get("max_loaded_models") == 1 and "no such file" in config.notes[0]


def test_corrupt_config_json_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        Config(tmp_path, environ={})


def test_runtime_changes_and_persisted_changes(tmp_path):
    config = Config(tmp_path, environ={})
    seen = []
    config.on_change(seen.append)
    # Flat backend keys, as Lemonade's recipe options spell them, mean their nested key.
    assert config.set_runtime({"llamacpp_args": "--threads 2", "sdcpp_steps": 4}) == \
        {"llamacpp.args": "--threads 2", "sdcpp.steps": 4}
    assert config.get("llamacpp.args") == "--threads 2" and seen[-1]["sdcpp.steps"] == 4
    assert not config.path.exists()
    config.set({"llamacpp": {"args": "--threads 3"}})  # the latest change of a key wins
    assert config.get("llamacpp.args") == "--threads 3" and config.get("sdcpp.steps") == 4
    assert Config(tmp_path, environ={}).get("sdcpp.steps") == DEFAULTS["sdcpp"]["steps"]  # gone at restart


@pytest.mark.parametrize(("body", "needle"), [
    ({"llamacpp_args": "--threads 2", "llamacpp": {"args": "--threads 3"}}, "Ambiguous"),
    ({"auto_evict_threshold_pct": 0}, "auto_evict_threshold_pct"),
    ({"auto_evict_threshold_pct": 1.5}, "auto_evict_threshold_pct"),
    ({"global_timeout": 0}, "global_timeout"),
    ({"no_fetch_executables": "yes"}, "no_fetch_executables"),
    ({"disable_model_filtering": 1}, "disable_model_filtering"),
    ({"llamacpp_nope": 1}, "llamacpp_nope"),
    ({"llamacpp": {"speculation": "sometimes"}}, "llamacpp.speculation' must be one of auto, on, off"),
    ({"whispercpp": {"backend": "gpu"}}, "whispercpp.backend' must be one of auto, cpu, vulkan, npu, got 'gpu'"),
    ({"sdcpp_backend": "cuda12"}, "sdcpp.backend' must be one of auto, cpu, vulkan, rocm, cuda, got 'cuda12'"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, body, needle):
    config = Config(tmp_path, environ={})
    with pytest.raises(ConfigError, match=needle):
        config.set_runtime(body)
    with pytest.raises(ConfigError, match=needle):
        config.set(body)
    assert not config.path.exists()


def test_media_engine_backends_take_auto_and_their_backends(tmp_path):
    """`whispercpp.backend` and `sdcpp.backend` (Lemonade's keys, default `auto`): `auto` or one of the
    engine's backends, whose state decides later whether it runs here."""
    config = Config(tmp_path, environ={})
    assert config.get("whispercpp.backend") == "auto" and config.get("sdcpp.backend") == "auto"
    config.set({"whispercpp": {"backend": "vulkan"}, "sdcpp": {"backend": "cpu"}})
    assert config.get("whispercpp.backend") == "vulkan" and config.get("sdcpp.backend") == "cpu"


def test_log_levels_of_the_guide(tmp_path):
    config = Config(tmp_path, environ={})
    for level in ("trace", "debug", "info", "warning", "error", "fatal", "none"):
        config.set({"log_level": level})


# ----- hardware-based model filtering (catalog/fit.py) ------------------------------------------

def _report(ram_gb: float, *gpus: Gpu) -> DeviceReport:
    cpu = CpuFacts(name="cpu", arch="x86_64", cores=2, threads=2, isa=(), memory_bytes=int(ram_gb * 2**30))
    return DeviceReport(cpu=cpu, gpus=gpus)


def test_what_fits_follows_the_largest_pool_or_80_percent_of_ram():
    assert memory_budget(_report(32)).max_model_gb == pytest.approx(25.6)
    dgpu = Gpu(kind="nvidia_gpu", name="g", index=0, vram_bytes=48 * 2**30, shared_bytes=16 * 2**30)
    assert memory_budget(_report(32, dgpu)).max_model_gb == pytest.approx(48)
    assert memory_budget(_report(32, dgpu), dgpu_gtt=True).max_model_gb == pytest.approx(64)  # enable_dgpu_gtt
    apu = Gpu(kind="amd_gpu", name="a", index=0, vram_bytes=2**30, shared_bytes=96 * 2**30, integrated=True)
    assert memory_budget(_report(128, apu)).max_model_gb == pytest.approx(102.4)  # 80 % of RAM beats 96
    assert memory_budget(_report(64, apu)).max_model_gb == pytest.approx(96)  # the APU's shared pool


def test_only_builtin_models_are_filtered(tmp_path):
    catalog = Catalog(tmp_path)
    budget = memory_budget(detect_devices())  # this machine, as the server sees it
    builtins = [m for m in catalog.all() if m.origin == "builtin" and m.size and not m.is_collection]
    assert all((too_big(m, budget) is None) == (m.size <= budget.max_model_gb) for m in builtins)
    biggest = max(builtins, key=lambda m: m.size)
    small = min(builtins, key=lambda m: m.size)
    tiny_machine = memory_budget(_report(small.size / 0.8 + 0.1))
    assert too_big(biggest, tiny_machine) and "disable_model_filtering" in too_big(biggest, tiny_machine)
    assert too_big(small, tiny_machine) is None


def test_memory_reading_is_real():
    use = memory_use()
    assert use.total_bytes > 0 and 0 < use.fraction < 1
    assert use.source in ("vram", "ram")
