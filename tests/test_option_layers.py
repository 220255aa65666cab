"""Backend-specific engine flags, the server-wide llama.cpp device and per-architecture defaults
(guide-configuration-README.md "Backend Configuration"; custom-models.md "Settings Priority";
upstream's architecture_defaults.json), and a Lemonade user's whole config.json.

- `llamacpp.<backend>_args` (and `whispercpp.` / `sdcpp.` / `vllm.` ones of the same shape) replace
  `llamacpp.args` for the backend a load runs on when they are set; `llamacpp.device` is where every
  llama.cpp model is offloaded unless a load says otherwise. Accepted by config.json, `lemonade config
  set`, the environment and `/v1/params` (admin only where an admin key is set, as `llamacpp.args`).
- A model's GGUF architecture picks shipped options (Qwen3's sampling) that sit under the model's own
  options and over the server-wide ones; `/v1/models/{id}/options` names the layer of every value.

The first tests drive the options layer (runtime/options.py) directly, with the model's architecture
and the backend a load would use given by stand-ins; the others run the real server and llama-server:
Gemma 3 270M, and a tiny random-weight model of the `qwen3` architecture (tests/models.py) whose
sampling settings llama-server itself reports back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from lemonade.backends.registry import ENGINE_CLASSES
from lemonade.config import BACKEND_ARGS, Config, ConfigError
from lemonade.runtime.options import LAYERS, RecipeOptions
from tests.helpers import GEMMA_NAME, Server, ServerFactory
from tests.models import tiny_qwen3_gguf

QWEN = "tiny-random-qwen3"  # the tiny Qwen3's id in the extra models dir (its file's stem)
QWEN3_SAMPLING = "--temp 0.6 --top-p 0.85 --top-k 20 --min-p 0.0 --repeat-penalty 1.0"  # as shipped


def layered(tmp_path: Path, config: dict[str, Any] | None = None, *, arch: str | None = None,
            backend: str = "cpu") -> RecipeOptions:
    """The options layer over a config.json; the model file's architecture and the backend its load
    would run on are given (the server reads them from the GGUF header and the engine)."""
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    opts = RecipeOptions(tmp_path, Config(tmp_path, environ={}))
    opts.architecture_of = lambda _name: arch
    opts.backend_of = lambda _recipe, _options: backend
    return opts


# ----- the options layer -------------------------------------------------------------------------

def test_the_backend_in_use_picks_its_own_flags_over_args(tmp_path):
    config = {"llamacpp": {"args": "--no-warmup", "cpu_args": "-t 2", "vulkan_args": "-ub 64"}}
    on_cpu = layered(tmp_path, config).resolve("m", "llamacpp")
    assert on_cpu["llamacpp_args"] == "-t 2"  # `args` is the fallback, unused when the backend has its own
    on_vulkan = layered(tmp_path, backend="vulkan").resolve("m", "llamacpp")
    assert on_vulkan["llamacpp_args"] == "-ub 64"
    on_rocm = layered(tmp_path, backend="rocm").resolve("m", "llamacpp")
    assert on_rocm["llamacpp_args"] == "--no-warmup"  # no rocm_args: the fallback
    opts = layered(tmp_path)
    opts.merge_saved("m", {"llamacpp_args": "-t 4 --no-mmap"})
    assert opts.resolve("m", "llamacpp")["llamacpp_args"] == "-t 4 --no-mmap"  # the model's flag wins, flag by flag
    assert opts.resolve("m", "llamacpp", request={"llamacpp_args": "-b 32"})["llamacpp_args"] == "-t 2 -b 32"
    merged, layers = opts.resolve_layers("m", "llamacpp")
    assert layers["llamacpp_args"] == ["saved", "config"]
    assert set(merged) == set(layers) and {n for names in layers.values() for n in names} <= set(LAYERS)
    alone = opts.resolve("m", "llamacpp", request={"merge_args": False})
    assert alone["llamacpp_args"] == "-t 4 --no-mmap"  # merge_args false: the highest layer alone


def test_other_engines_take_backend_flags_of_the_same_shape(tmp_path):
    opts = layered(tmp_path, {"whispercpp": {"args": "-t 1", "cpu_args": "-t 2 -bs 5"},
                              "sdcpp": {"vulkan_args": "--vae-tiling"}})
    assert opts.resolve("w", "whispercpp")["whispercpp_args"] == "-t 2 -bs 5"
    assert opts.resolve("s", "sd-cpp")["sdcpp_args"] == ""  # sd-cpp on cpu: no flags of its own
    assert layered(tmp_path, backend="vulkan").resolve("s", "sd-cpp")["sdcpp_args"] == "--vae-tiling"
    for section, backends in BACKEND_ARGS.items():  # every backend each engine lists has a key
        engine = next(e for e in ENGINE_CLASSES if e.args_option and e.options[e.args_option].config_key
                      == f"{section}.args")
        assert set(engine.backends) <= set(backends), section


def test_the_device_is_server_wide_and_a_load_may_change_it(tmp_path):
    opts = layered(tmp_path, {"llamacpp": {"device": "Vulkan0"}})
    assert opts.resolve("m", "llamacpp")["llamacpp_device"] == "Vulkan0"
    assert opts.resolve("m", "llamacpp", request={"llamacpp_device": "Vulkan1"})["llamacpp_device"] == "Vulkan1"
    with pytest.raises(ConfigError, match="llamacpp.device"):
        Config(tmp_path, environ={}).set({"llamacpp": {"device": "--device /dev/x"}})
    env = Config(tmp_path, environ={"LEMONADE_LLAMACPP_DEVICE": "CUDA0,CUDA1", "LEMONADE_LLAMACPP_CPU_ARGS": "-t 3"})
    assert env.get("llamacpp.device") == "CUDA0,CUDA1" and env.get("llamacpp.cpu_args") == "-t 3"


def test_architecture_defaults_sit_between_the_model_and_the_server(tmp_path):
    opts = layered(tmp_path, {"llamacpp": {"args": "--no-warmup --temp 0.9"}}, arch="qwen3")
    eff, layers = opts.resolve_layers("m", "llamacpp")
    assert eff["llamacpp_args"] == "--no-warmup " + QWEN3_SAMPLING  # over the server's --temp
    assert layers["llamacpp_args"] == ["architecture", "config"]
    opts.merge_saved("m", {"llamacpp_args": "--temp 0.2"})
    eff = opts.resolve("m", "llamacpp")
    assert eff["llamacpp_args"] == "--no-warmup --top-p 0.85 --top-k 20 --min-p 0.0 --repeat-penalty 1.0 --temp 0.2"
    # a load's flags replace the model scope (saved and architecture), and keep the server's
    assert opts.resolve("m", "llamacpp", request={"llamacpp_args": "-t 1"})["llamacpp_args"] == \
        "--no-warmup --temp 0.9 -t 1"
    # a null skips the saved flags for this load: the architecture's are used again
    assert opts.resolve("m", "llamacpp", request={"llamacpp_args": None})["llamacpp_args"] == \
        "--no-warmup " + QWEN3_SAMPLING
    assert layered(tmp_path, arch="gemma3").resolve("x", "llamacpp")["llamacpp_args"] == "--no-warmup --temp 0.9"
    assert layered(tmp_path, arch="qwen3").resolve("w", "whispercpp")["whispercpp_args"] == ""  # GGUF recipes only


def test_shipped_architecture_entries_are_valid_options(tmp_path):
    from lemonade.catalog.architecture_defaults import architecture_defaults

    shipped = architecture_defaults()
    assert {"qwen3", "qwen35", "qwen35moe", "qwen3next", "gemma4", "nemotron_h_moe"} <= set(shipped)
    for arch, options in shipped.items():
        assert not any(k.endswith("_backend") for k in options), arch
        assert layered(tmp_path, arch=arch).architecture_options("m", "llamacpp") == options, arch


# ----- on the real server and llama-server -------------------------------------------------------

ADMIN, USER = {"Authorization": "Bearer admin-key"}, {"Authorization": "Bearer user-key"}


@pytest.fixture
def server(make_server: ServerFactory, gemma_dir: Path, tmp_path: Path) -> Server:
    """Gemma 3 270M and the tiny Qwen3 in the extra models dir; an API key and an admin key, since
    who may set engine flags is under test."""
    extra = tmp_path / "models"
    extra.mkdir()
    (extra / f"{GEMMA_NAME}.gguf").symlink_to(gemma_dir / f"{GEMMA_NAME}.gguf")
    (extra / f"{QWEN}.gguf").symlink_to(tiny_qwen3_gguf())
    return make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra), "LEMONADE_API_KEY": "user-key",
                            "LEMONADE_ADMIN_API_KEY": "admin-key"})


def cli(server: Server, *args: str, key: str = "admin-key") -> subprocess.CompletedProcess[str]:
    """`lemonade ARGS` as a user types it, with the key of `LEMONADE_ADMIN_API_KEY` (or another)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_BASE_URL": server.url, "LEMONADE_ADMIN_API_KEY": key, "COLUMNS": "250"})
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def engine(c: httpx.Client, model: str) -> dict[str, Any]:
    """The loaded model as `/v1/health` shows it to the admin."""
    return next(m for m in c.get("/v1/health", headers=ADMIN).json()["all_models_loaded"] if m["model_name"] == model)


def load(c: httpx.Client, model: str, **options: Any) -> dict[str, Any]:
    c.post("/v1/unload", json={"model_name": model}, headers=ADMIN)
    resp = c.post("/v1/load", json={"model_name": model, **options}, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    return engine(c, model)


def test_backend_flags_are_the_admins_and_reach_the_engine_of_the_backend_in_use(server: Server):
    proc = cli(server, "config", "set", "llamacpp.cpu_args=--threads-batch 1 --no-warmup", key="user-key")
    assert proc.returncode != 0 and "admin" in (proc.stdout + proc.stderr).lower()  # /internal/set: the admin's
    proc = cli(server, "config", "set", "llamacpp.args=--cache-reuse 256", "llamacpp.cpu_args=--threads-batch 1 "
               "--no-warmup", "llamacpp.vulkan_args=-ub 64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = cli(server, "config", "set", "llamacpp.cpu_args=--port 9")  # a flag the server sets itself
    assert refused.returncode != 0 and "--port" in refused.stdout + refused.stderr
    with server.client() as c:
        flat = c.post("/v1/params", json={"llamacpp_rocm_args": "-b 768"}, headers=USER)
        assert flat.status_code == 403 and "llamacpp.rocm_args" in flat.json()["error"]  # as llamacpp.args
        assert c.post("/v1/params", json={"llamacpp_rocm_args": "-b 768"}, headers=ADMIN).status_code == 200
        params = c.get("/v1/params", headers=USER).json()["llamacpp"]
        assert (params["cpu_args"], params["vulkan_args"], params["rocm_args"]) == \
            ("--threads-batch 1 --no-warmup", "-ub 64", "-b 768")

        argv = load(c, GEMMA_NAME, llamacpp_backend="cpu")["launch_command"]
        assert argv[argv.index("--threads-batch") + 1] == "1" and "--no-warmup" in argv
        assert "--cache-reuse" not in argv and "-ub" not in argv and "768" not in argv  # only the cpu backend's
        # per-model flags merge over them, flag by flag; the options view says where each came from
        view = c.post(f"/v1/models/{GEMMA_NAME}/options", json={"llamacpp_args": "--threads-batch 2"},
                      headers=ADMIN).json()
        assert view["layers"]["llamacpp_args"][:2] == ["saved", "config"]
        assert view["architecture"] == "gemma3" and view["architecture_defaults"] == {}
        argv = load(c, GEMMA_NAME)["launch_command"]
        assert argv[argv.index("--threads-batch") + 1] == "2" and "--no-warmup" in argv
        # with no flags of its own for the backend in use, `args` applies again
        assert c.post("/internal/set", json={"llamacpp": {"cpu_args": ""}}, headers=ADMIN).status_code == 200
        argv = load(c, GEMMA_NAME)["launch_command"]
        assert "--cache-reuse" in argv and "--no-warmup" not in argv
        reply = c.post("/v1/chat/completions", headers=USER, json={
            "model": GEMMA_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
    saved = json.loads((server.config_dir / "config.json").read_text())["llamacpp"]
    assert saved == {"args": "--cache-reuse 256", "cpu_args": "", "vulkan_args": "-ub 64"}  # /v1/params: not saved


def test_qwen3_gets_its_sampling_from_the_architecture_defaults(server: Server):
    with server.client() as c:
        view = c.get(f"/v1/models/{QWEN}/options", headers=USER).json()
        assert view["architecture"] == "qwen3"
        assert view["architecture_defaults"] == {"llamacpp_args": QWEN3_SAMPLING}
        assert view["layers"]["llamacpp_args"][0] == "architecture"
        assert QWEN3_SAMPLING in view["effective"]["llamacpp_args"]
        assert view["layers"]["ctx_size"] in (["default"], ["auto_tune"])

        loaded = load(c, QWEN)
        assert QWEN3_SAMPLING in " ".join(loaded["launch_command"])
        assert QWEN3_SAMPLING in loaded["recipe_options"]["llamacpp_args"]
        sampling = props(loaded)
        assert (round(sampling["temperature"], 2), sampling["top_k"], round(sampling["top_p"], 2)) == (0.6, 20, 0.85)
        reply = c.post("/v1/chat/completions", headers=USER, json={
            "model": QWEN, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0, reply.text

        # the model's own options win over its architecture's, flag by flag
        view = c.post(f"/v1/models/{QWEN}/options", json={"llamacpp_args": "--temp 0.3"}, headers=USER).json()
        assert view["layers"]["llamacpp_args"][:2] == ["saved", "architecture"]
        sampling = props(load(c, QWEN))
        assert (round(sampling["temperature"], 2), sampling["top_k"]) == (0.3, 20)
        # a load's own flags replace the model's and the architecture's, keeping the server's
        loaded = load(c, QWEN, llamacpp_args="--temp 0.5")
        assert "--top-k" not in loaded["launch_command"] and "--temp" in loaded["launch_command"]
        sampling = props(loaded)
        assert (round(sampling["temperature"], 2), sampling["top_k"]) == (0.5, 40)  # 40: llama-server's own


def props(loaded: dict[str, Any]) -> dict[str, Any]:
    """The sampling llama-server itself says it uses by default (its `/props`)."""
    base = loaded["backend_url"].removesuffix("/v1")
    return httpx.get(base + "/props", timeout=30).json()["default_generation_settings"]["params"]
