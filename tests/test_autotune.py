"""Auto-tune: archetype detection, the profile schema, the options layer, and `lemonade bench`.

Detection is fed device data of other machines in `/v1/system-info`'s `devices` format (the Ryzen AI
9 HX 375 one is the spec's own recorded example) plus this machine's real data. The options layer
is tested with the real `Config`, `RecipeOptions` and `AutoTune` objects of the server, and end to
end on a real server with the real Gemma 3 270M: what `/v1/health`, `lemonade status` and the
engine's command line show, the off switch, and `lemonade bench` with a tiny grid and `--submit`
(the rest of `lemonade bench` is in tests/test_bench.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lemonade.autotune.archetype import MachineFacts, detect, local_facts
from lemonade.autotune.profiles import ProfileError, load_all, load_file, validate
from lemonade.autotune.tuner import AutoTune
from lemonade.backends.registry import Engines
from lemonade.config import Config
from lemonade.runtime.options import RecipeOptions
from tests.helpers import GEMMA_ID, GEMMA_NAME

DEVICE_FIXTURES = Path(__file__).parent / "fixtures" / "devices"
AVX2 = frozenset("fpu sse sse2 avx fma avx2 f16c".split())
AVX512 = AVX2 | frozenset("avx512f avx512bw avx512vl avx512dq".split())

# Device data of real machines, in /v1/system-info's `devices` format.
MACHINES: dict[str, tuple[MachineFacts, str, str]] = {
    # The spec's recorded example (api-lemonade.md, GET /v1/system-info): an HX 375 laptop, 32 GB.
    "hx375": (MachineFacts(devices={
        "cpu": {"name": "AMD Ryzen AI 9 HX 375 w/ Radeon 890M", "cores": 12, "threads": 24, "available": True,
                "family": "x86_64"},
        "amd_gpu": [{"name": "AMD Radeon(TM) 890M Graphics", "vram_gb": 0.5, "available": True,
                     "family": "gfx1150"}],
        "amd_npu": {"name": "AMD Ryzen AI 9 HX 375 w/ Radeon 890M", "available": True, "family": "XDNA2"}},
        memory_gb=31.1, cpu_flags=AVX512), "radeon-890m-32gb", "unified"),
    # Framework Desktop / GMKtec EVO-X2: Ryzen AI Max+ 395, 128 GB, Radeon 8060S (gfx1151).
    "strix-halo": (MachineFacts(devices={
        "cpu": {"name": "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S", "cores": 16, "threads": 32, "available": True},
        "amd_gpu": [{"name": "AMD Radeon(TM) 8060S Graphics", "vram_gb": 96.0, "available": True,
                     "family": "gfx1151"}]},
        memory_gb=125.6, cpu_flags=AVX512), "strix-halo-128gb", "unified"),
    # A Ryzen 7 7840U laptop with 16 GB: Radeon 780M (gfx1103) with 2 GB carved out of RAM.
    "780m": (MachineFacts(devices={
        "cpu": {"name": "AMD Ryzen 7 7840U w/ Radeon 780M Graphics", "cores": 8, "threads": 16},
        "amd_gpu": [{"name": "AMD Radeon 780M Graphics", "vram_gb": 2.0, "available": True, "family": "gfx1103"}]},
        memory_gb=14.9, cpu_flags=AVX512), "radeon-780m-16gb", "unified"),
    # A MacBook Pro M3 Pro, 36 GB.
    "m3": (MachineFacts(devices={
        "cpu": {"name": "Apple M3 Pro", "cores": 11, "threads": 11},
        "metal": {"name": "Apple M3 Pro", "available": True, "vram_gb": 27.0}},
        memory_gb=36.0, cpu_arch="arm64", cpu_flags=frozenset()), "apple-m3-48gb", "unified"),
    # A desktop with an RTX 4090 (24 GB) and 64 GB RAM: the discrete card decides.
    "rtx4090": (MachineFacts(devices={
        "cpu": {"name": "AMD Ryzen 9 7950X 16-Core Processor", "cores": 16, "threads": 32},
        "nvidia_gpu": [{"name": "NVIDIA GeForce RTX 4090", "vram_gb": 23.99, "available": True}]},
        memory_gb=62.7, cpu_flags=AVX512), "nvidia-rtx-4090-24gb", "discrete"),
    # A 4-core AVX2 VM with no GPU.
    "vm": (MachineFacts(devices={"cpu": {"name": "Intel Xeon E5-2690 v4", "cores": 4, "threads": 4},
                                 "amd_gpu": [], "nvidia_gpu": []}, memory_gb=15.6, cpu_flags=AVX2),
           "cpu-x86_64-avx2-4c-16gb", "system"),
}


@pytest.mark.parametrize("machine", list(MACHINES))
def test_archetype_of_recorded_machines(machine: str) -> None:
    facts, expected, memory = MACHINES[machine]
    arch = detect(facts)
    assert arch.id == expected
    assert arch.memory == memory
    assert arch.lookup[0] == expected
    assert arch.lookup[-1].startswith("cpu-")  # backends a GPU profile leaves out fall back to the CPU's


def recorded(*, gpus: list[Any] = (), vulkan: str | None = None, arch: str = "x86_64", cores: int = 8,
             isa: tuple[str, ...] = ("avx2", "fma"), memory_gb: int = 32) -> MachineFacts:
    """Facts as this server builds them (system/devices.py report -> system-info devices) from the
    recorded tool outputs of real machines in tests/fixtures/devices."""
    from lemonade.autotune.archetype import facts_from_devices
    from lemonade.system.devices import CpuFacts, DeviceReport, parse_vulkaninfo_summary
    from lemonade.system.info import devices

    vk = parse_vulkaninfo_summary((DEVICE_FIXTURES / vulkan).read_text()) if vulkan else []
    cpu = CpuFacts(name="recorded", arch=arch, cores=cores, threads=cores * 2, isa=isa, memory_bytes=memory_gb * 2**30)
    return facts_from_devices(devices(DeviceReport(cpu=cpu, gpus=tuple(gpus), vulkan=tuple(vk))))


def test_archetype_from_recorded_tool_outputs() -> None:
    from lemonade.system.devices import parse_nvidia_smi_csv, parse_rocm_smi_json, parse_system_profiler_displays

    [m3] = parse_system_profiler_displays((DEVICE_FIXTURES / "system_profiler_m3_pro.json").read_text(), 36 * 2**30)
    arch = detect(recorded(gpus=[m3], arch="arm64", cores=11, isa=("asimd", "asimddp"), memory_gb=36))
    assert (arch.id, arch.memory, arch.cpu_id) == ("apple-m3-48gb", "unified", "cpu-aarch64-neon-dotprod-16c-48gb")
    a100s = [g for g, _ in parse_nvidia_smi_csv((DEVICE_FIXTURES / "nvidia_smi_2x_a100.csv").read_text())]
    arch = detect(recorded(gpus=a100s, memory_gb=256))
    # nvidia-smi's recording names the A100 board and reports no memory: the family alone
    assert (arch.id, arch.memory, arch.memory_gb) == ("nvidia-pg509-210", "discrete", None)
    assert arch.lookup == ("nvidia-pg509-210", "cpu-x86_64-avx2-8c-256gb", "cpu-x86_64-avx2-8c", "cpu-x86_64-avx2")
    rocm = parse_rocm_smi_json((DEVICE_FIXTURES / "rocm_smi_rx7900xt.json").read_text())
    assert rocm  # the RX 7900 XT as the hardware tests build it from sysfs + rocm-smi
    from lemonade.system.devices import Gpu

    rx = Gpu(kind="amd_gpu", name="Radeon RX 7900 XT", index=0, vram_bytes=21458059264, integrated=False,
             family="gfx1100")
    assert detect(recorded(gpus=[rx])).id == "amd-rx-7900-xt-24gb"
    # lavapipe (Mesa's software Vulkan) is no GPU: the CPU archetype stands
    arch = detect(recorded(vulkan="vulkaninfo_lavapipe_debian12.txt", cores=2, isa=("avx2", "fma", "avx512f",
                                                                                     "avx512bw", "avx512vl"),
                           memory_gb=23))
    assert (arch.id, arch.device) == ("cpu-x86_64-avx512-2c-24gb", "cpu")


def test_gpu_archetypes_fall_back_to_family_then_cpu() -> None:
    arch = detect(MACHINES["strix-halo"][0])
    assert arch.lookup == ("strix-halo-128gb", "strix-halo", "cpu-x86_64-avx512-16c-128gb",
                           "cpu-x86_64-avx512-16c", "cpu-x86_64-avx512")
    assert arch.cpu_cores == 16 and arch.cpu_isa == "avx512"
    arm = detect(MACHINES["m3"][0])
    assert arm.family == "apple-m3" and arm.cpu_id.startswith("cpu-aarch64-neon")


def test_archetype_of_this_machine() -> None:
    """The real detection: the id follows from /proc/cpuinfo, the core count and RAM."""
    arch = detect(local_facts())
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    isa = "avx512" if {"avx512f", "avx512bw", "avx512vl"} <= set(flags) else "avx2" if "avx2" in flags else None
    assert arch.device == "cpu"  # no GPU on the test machines
    assert re.fullmatch(r"cpu-x86_64-[a-z0-9-]+-\d+c-\d+gb", arch.id), arch.id
    if isa:
        assert arch.cpu_isa == isa
    assert arch.cpu_cores >= 1


# ----- profiles ------------------------------------------------------------------------------------

def profile(**recipes: Any) -> dict[str, Any]:
    return {"schema_version": 1, "archetype": "cpu-x86_64-avx2-4c", "description": "test machines",
            "source": "written by the test", "recipes": recipes}


def test_bundled_profiles_are_valid() -> None:
    profiles, errors = load_all()
    assert errors == []
    assert {"strix-halo-128gb", "radeon-780m", "apple-m3"} <= set(profiles)
    assert any(name.startswith("cpu-") for name in profiles)


@pytest.mark.parametrize("bad, where, says", [
    ({"schema_version": 2}, "schema_version", "must be 1"),
    (profile(llamacpp={"defaults": {"cpu": {"llamacpp_args": "--port 9"}}}),
     "recipes.llamacpp.defaults.cpu.llamacpp_args", "--port"),
    (profile(llamacpp={"defaults": {"cpu": {"evict_idle_timeout": 3}}}),
     "recipes.llamacpp.defaults.cpu.evict_idle_timeout", "not a performance option"),
    (profile(llamacpp={"defaults": {"cpu": {"ctx_size": "big"}}}), "recipes.llamacpp.defaults.cpu.ctx_size",
     "must be an integer"),
    (profile(llamacpp={"defaults": {"cpu": {"llamacpp_backend": "vulkan"}}}),
     "recipes.llamacpp.defaults.cpu.llamacpp_backend", "only be chosen under"),
    (profile(llamacpp={"defaults": {"gpu": {}}}), "recipes.llamacpp.defaults.gpu", "unknown backend"),
    (profile(nosuch={"defaults": {}}), "recipes.nosuch", "unknown recipe"),
    ({**profile(llamacpp={"defaults": {}}), "archetype": "Strix Halo"}, "archetype", "archetype id"),
    ({**profile(llamacpp={"defaults": {}}), "source": ""}, "source", "non-empty"),
])
def test_bad_profile_is_refused_with_the_field(bad: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(ProfileError) as exc:
        validate(bad, "my.json")
    assert f"my.json: {where}:" in str(exc.value)
    assert says in str(exc.value)


def test_profile_file_name_must_match(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps(profile(llamacpp={"defaults": {"cpu": {"llamacpp_args": "-t 2"}}})))
    with pytest.raises(ProfileError, match="name it cpu-x86_64-avx2-4c.json"):
        load_file(path)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot be read as JSON"):
        load_file(path)


# ----- the options layer ---------------------------------------------------------------------------

VM = MACHINES["vm"][0]


def tuned_options(tmp_path: Path, recipes: dict[str, Any], config: dict[str, Any] | None = None,
                  environ: dict[str, str] | None = None) -> tuple[RecipeOptions, AutoTune, Config]:
    """The server's own objects for a 4-core AVX2 VM with one local profile."""
    folder = tmp_path / "autotune" / "profiles"
    folder.mkdir(parents=True)
    (folder / "cpu-x86_64-avx2-4c.json").write_text(json.dumps(profile(**recipes)))
    if config:
        (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = Config(tmp_path, environ=environ or {})
    tune = AutoTune(tmp_path, cfg, facts=VM, engines=Engines(tmp_path, cfg))  # `auto` -> the best backend here
    opts = RecipeOptions(tmp_path, cfg)
    opts.tuning = tune.values
    return opts, tune, cfg


LAYERS = {"llamacpp": {"defaults": {"*": {"ctx_size": 2048}, "cpu": {"llamacpp_args": "-t 3 -np 6"}},
                       "models": {GEMMA_NAME: {"cpu": {"llamacpp_args": "-np 8"}}}}}


def test_profile_fills_what_the_user_left_alone(tmp_path: Path) -> None:
    opts, tune, _ = tuned_options(tmp_path, LAYERS)
    other = opts.resolve("extra.other", "llamacpp")
    assert other["ctx_size"] == 2048 and other["llamacpp_args"] == "-t 3 -np 6"  # archetype defaults
    gemma = opts.resolve(GEMMA_ID, "llamacpp")
    assert gemma["llamacpp_args"] == "-t 3 -np 8"  # the model overlay over the defaults
    loaded = tune.for_loaded(GEMMA_ID, "llamacpp", "cpu", gemma)
    assert loaded == {"profile": "cpu-x86_64-avx2-4c", "model_overlay": True,
                      "overrides": {"ctx_size": 2048, "llamacpp_args": "-t 3 -np 8"}}


def test_user_options_win_over_the_profile(tmp_path: Path) -> None:
    opts, tune, _ = tuned_options(tmp_path, LAYERS, config={"llamacpp": {"args": "-t 1"}, "ctx_size": 4096})
    eff = opts.resolve("extra.other", "llamacpp")
    assert eff["ctx_size"] == 4096  # config file beats the profile
    assert eff["llamacpp_args"] == "-np 6 -t 1"  # flag by flag: the config's -t wins, the profile's -np stays
    eff = opts.resolve("extra.other", "llamacpp", request={"llamacpp_args": "-np 2", "ctx_size": 1024})
    assert eff["ctx_size"] == 1024 and eff["llamacpp_args"] == "-t 1 -np 2"  # the request beats both
    assert tune.for_loaded("extra.other", "llamacpp", "cpu", eff)["overrides"] == {}
    opts.merge_saved("extra.other", {"llamacpp_args": "-np 3"})
    assert opts.resolve("extra.other", "llamacpp")["llamacpp_args"] == "-t 1 -np 3"  # saved options too
    eff = opts.resolve("extra.other", "llamacpp", request={"llamacpp_args": "-b 64", "merge_args": False})
    assert eff["llamacpp_args"] == "-b 64"  # merge_args=false: the user's args alone


def test_env_and_backend_choice_beat_the_profile(tmp_path: Path) -> None:
    recipes = {"llamacpp": {"defaults": {"*": {"llamacpp_backend": "vulkan"}, "vulkan": {"llamacpp_args": "-ub 64"},
                                         "cpu": {"llamacpp_args": "-t 3"}}}}
    opts, _, _ = tuned_options(tmp_path, recipes)
    eff = opts.resolve("extra.x", "llamacpp")
    assert (eff["llamacpp_backend"], eff["llamacpp_args"]) == ("vulkan", "-ub 64")  # the profile's backend
    eff = opts.resolve("extra.x", "llamacpp", request={"llamacpp_backend": "cpu"})
    assert (eff["llamacpp_backend"], eff["llamacpp_args"]) == ("cpu", "-t 3")  # that backend's block
    opts, _, _ = tuned_options(tmp_path / "env", recipes, environ={"LEMONADE_LLAMACPP": "cpu"})
    eff = opts.resolve("extra.x", "llamacpp")
    assert (eff["llamacpp_backend"], eff["llamacpp_args"]) == ("cpu", "-t 3")


def test_off_switch(tmp_path: Path) -> None:
    opts, tune, cfg = tuned_options(tmp_path, LAYERS)
    cfg.set({"auto_tune": False})
    eff = opts.resolve(GEMMA_ID, "llamacpp")
    assert eff["llamacpp_args"] == "" and eff["ctx_size"] == -1  # the recipe defaults
    assert tune.describe()["enabled"] is False
    assert tune.for_loaded(GEMMA_ID, "llamacpp", "cpu", eff) is None


# ----- end to end ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_servers, gemma_dir, tmp_path_factory):
    """A server with a local profile for this machine's exact archetype (the bundled ones stay too)."""
    cache = tmp_path_factory.mktemp("autotune-cache")
    arch = detect(local_facts())
    folder = cache / "autotune" / "profiles"
    folder.mkdir(parents=True)
    mine = {"schema_version": 1, "archetype": arch.id, "description": "this machine", "source": "the test",
            "recipes": {"llamacpp": {"models": {GEMMA_NAME: {"cpu": {"llamacpp_args": "-np 3"}}}}}}
    (folder / f"{arch.id}.json").write_text(json.dumps(mine))
    (folder / "broken.json").write_text(json.dumps({"schema_version": 1, "archetype": "broken"}))
    # llamacpp.args "-t 1": on a CI machine whose other jobs hold the CPU, llama-server's default of
    # one thread per core stalls (docs/performance.md, Auto-tune); one thread keeps the bench test fast.
    srv = module_servers(cache=cache, env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                         config={"llamacpp": {"args": "-t 1"}})
    srv.archetype = arch.id
    return srv


def cli(server, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_BASE_URL": server.url, "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def test_health_and_status_show_archetype_and_overrides(server) -> None:
    with server.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
        health = c.get("/v1/health").json()
    tune = health["auto_tune"]
    assert tune["enabled"] is True and tune["archetype"]["id"] == server.archetype
    assert tune["profiles"][0] == server.archetype
    assert any("broken.json" in e and "description" in e for e in tune["errors"])  # a bad file: said, skipped
    (entry,) = health["all_models_loaded"]
    assert entry["auto_tune"] == {"profile": server.archetype, "model_overlay": True,
                                  "overrides": {"llamacpp_args": "-np 3"}}
    cmd = entry["launch_command"]
    assert cmd[cmd.index("-np") + 1] == "3"  # the engine really runs with it
    done = cli(server, "status")
    assert done.returncode == 0, done.stderr
    assert f"archetype {server.archetype}" in done.stdout
    assert f"{GEMMA_NAME}: llamacpp_args=-np 3 (profile {server.archetype}, model overlay)" in done.stdout


def test_user_option_and_off_switch_end_to_end(server) -> None:
    with server.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_args": "-np 2"}).status_code == 200
        (entry,) = c.get("/v1/health").json()["all_models_loaded"]
        assert entry["launch_command"][entry["launch_command"].index("-np") + 1] == "2"  # the user's value
        assert entry["auto_tune"]["overrides"] == {}
        assert c.post("/internal/set", json={"auto_tune": False}).status_code == 200
        try:
            assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
            health = c.get("/v1/health").json()
            assert health["auto_tune"]["enabled"] is False
            (entry,) = health["all_models_loaded"]
            assert "-np" not in entry["launch_command"] and entry["auto_tune"] is None
            assert "off (auto_tune=false)" in cli(server, "status").stdout
        finally:
            assert c.post("/internal/set", json={"auto_tune": True}).status_code == 200


def test_bench_tiny_grid_writes_table_json_and_submit_file(server, tmp_path: Path) -> None:
    out, sub = tmp_path / "bench.json", tmp_path / "submit.json"
    done = cli(server, "bench", GEMMA_NAME, "--parallel", "2", "--runs", "1", "--scenarios", "chat-short",
               "--streams", "2", "--output", str(out), "--submit", "--submit-file", str(sub), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Backend: llamacpp/cpu parallel=2" in done.stdout and "2 streams:" in done.stdout
    report = json.loads(out.read_text())
    (model,) = report["models"]
    stock, one = model["results"]
    assert stock["stock"] is True and stock["params"] == {"parallel": None}
    assert one["stock"] is False and one["params"] == {"parallel": 2}
    assert stock["launch_command"][stock["launch_command"].index("-np") + 1] == "3"  # the profile's (warned)
    assert one["launch_command"][one["launch_command"].index("-np") + 1] == "2"  # the grid's value wins
    assert "Auto-tune is on" in done.stderr
    for r in (stock, one):
        (chat,) = r["scenarios"]
        assert chat["name"] == "chat-short" and chat["tps"]["mean"] > 0 and chat["ttft_ms"]["mean"] > 0
        assert r["concurrent"]["streams"] == 2 and r["concurrent"]["tokens_per_s"] > 0
        assert r["model_memory_peak_gb"] > 0.01  # the engine's memory, as the server measured it
    contribution = json.loads(sub.read_text())
    assert contribution["schema"] == "lemonade-autotune-contribution/1"
    assert contribution["archetype"]["id"] == server.archetype
    assert contribution["models"][0]["stock"]["tps_1"] > 0 and contribution["models"][0]["stock"]["tps_n"] > 0
    if contribution["proposed_profile"] is not None:  # only when -np 2 beat stock here
        validate(contribution["proposed_profile"])
    bad = cli(server, "bench", GEMMA_NAME, "--threads", "two")
    assert bad.returncode == 2 and "--threads takes positive integers" in bad.stderr
