"""Lemonade's configuration guide (guide-configuration-README.md, -multi-model.md) against the real
server: where state lives and that it survives a cache clean-up, the old layout moved at start, the
guide's CLI examples and example config.json as written, `GET/POST /v1/params`, hardware-based
model filtering, memory-pressure eviction on this machine's real memory reading, backend binary
selection (`llamacpp.cpu_bin`: your own build, `latest` and a pinned tag), `no_fetch_executables`,
and the startup warning of a server exposed without an API key."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from lemonade.config import deep_merge, flatten
from tests.helpers import GEMMA_NAME, served_folder, wait_for

USER_MODEL = {"model_name": "user.Tiny-Kept", "recipe": "llamacpp", "checkpoint": "someone/Tiny-GGUF:Q4_0"}


def cli(*args: str, url: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`lemonade ARGS` as a user types it, pointed at the test server by LEMONADE_BASE_URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_BASE_URL": url, "COLUMNS": "250", **(extra_env or {})})
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def loaded(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["model_name"]: m for m in c.get("/v1/health").json()["all_models_loaded"]}


# ----- where state lives -------------------------------------------------------------------------

def test_default_layout_old_files_moved_and_a_cache_clean_up_forgets_nothing(make_server, tmp_path):
    """No LEMONADE_* dirs: state in ~/.config/lemonade, caches in ~/.cache/lemonade, as the guide says.
    Files an older version left in ~/.cache/lemonade are moved at the first start; `rm -rf ~/.cache`
    afterwards loses no registered model, alias or setting."""
    home = tmp_path / "home"
    old = home / ".cache" / "lemonade"
    old.mkdir(parents=True)
    (old / "config.json").write_text(json.dumps({"max_loaded_models": 2}))
    (old / "user_models.json").write_text(json.dumps({"Old-One": {"recipe": "llamacpp",
                                                                  "checkpoint": "someone/Old-GGUF:Q4_0"}}))
    env = {"HOME": str(home), "LEMONADE_CACHE_DIR": "", "LEMONADE_CONFIG_DIR": "", "XDG_CONFIG_HOME": "",
           "XDG_CACHE_HOME": "", "STATE_DIRECTORY": "", "CACHE_DIRECTORY": ""}
    config_dir = home / ".config" / "lemonade"
    srv = make_server(env=env)
    with srv.client() as c:
        assert c.get("/internal/config").json()["max_loaded_models"] == 2
        info = c.get("/v1/system-info", params={"include_paths": True}).json()
        assert info["config_dir"] == str(config_dir) and info["cache_dir"] == str(old)
        assert c.post("/v1/models/register", json=USER_MODEL).status_code == 200
        assert c.post("/internal/aliases", json={"alias": "kept", "target": "user.Tiny-Kept"}).status_code == 200
        assert c.post("/internal/set", json={"ctx_size": 2048}).status_code == 200
    assert "Moved user_models.json" in srv.log() and "Moved config.json" in srv.log()
    assert not (old / "user_models.json").exists() and not (old / "config.json").exists()
    assert sorted(p.name for p in config_dir.iterdir()) == ["aliases.json", "config.json", "user_models.json"]
    srv.stop()

    shutil.rmtree(home / ".cache")  # the user's cache clean-up
    again = make_server(env=env)
    with again.client() as c:
        models = {m["id"] for m in c.get("/v1/models", params={"show_all": True}).json()["data"]}
        assert {"Old-One", "Tiny-Kept", "kept"} <= models
        cfg = c.get("/internal/config").json()
        assert cfg["max_loaded_models"] == 2 and cfg["ctx_size"] == 2048
    assert (home / ".cache" / "lemonade").is_dir()  # caches come back where they belong


def test_a_cache_dir_alone_moves_only_the_cache(make_server, tmp_path):
    """LEMONADE_CACHE_DIR without LEMONADE_CONFIG_DIR: engines and downloads go there, the configuration
    stays in the platform's config dir, as in Lemonade's server (its get_config_dir does not read the
    variable), so a clean-up of the moved cache resets nothing. Settings an older version of this
    server kept in that cache dir are moved over at the first start. (`lemond CACHE_DIR` keeps both
    together: tests/test_lemond.py.)"""
    home, cache = tmp_path / "home", tmp_path / "elsewhere"
    config_dir = home / ".config" / "lemonade"
    cache.mkdir()
    (cache / "config.json").write_text(json.dumps({"max_loaded_models": 2}))  # where an older version kept it
    env = {"HOME": str(home), "LEMONADE_CONFIG_DIR": "", "XDG_CONFIG_HOME": "", "STATE_DIRECTORY": ""}
    before = cli("config", "set", "ctx_size=2048", url="http://127.0.0.1:9",  # no server yet: the file itself
                 extra_env={**env, "LEMONADE_CACHE_DIR": str(cache)})
    assert before.returncode == 0, before.stderr
    assert json.loads((config_dir / "config.json").read_text()) == {"max_loaded_models": 2, "ctx_size": 2048}
    assert not (cache / "config.json").exists()
    srv = make_server(cache=cache, env=env)
    with srv.client() as c:
        info = c.get("/v1/system-info", params={"include_paths": True}).json()
        assert info["config_dir"] == str(config_dir) and info["cache_dir"] == str(cache)
        assert c.get("/internal/config").json()["ctx_size"] == 2048
        assert c.post("/v1/models/register", json=USER_MODEL).status_code == 200
    assert (config_dir / "user_models.json").is_file() and not (cache / "user_models.json").exists()
    assert (cache / "backends").is_dir()  # the cache is where it was asked to be
    srv.stop()
    shutil.rmtree(cache)
    again = make_server(cache=cache, env=env)
    with again.client() as c:
        assert c.get("/internal/config").json()["max_loaded_models"] == 2
        assert "Tiny-Kept" in {m["id"] for m in c.get("/v1/models", params={"show_all": True}).json()["data"]}


def test_a_move_cut_short_is_finished_at_the_next_start(make_server, tmp_path):
    """The state a crash between "copied" and "old one removed" leaves: both copies. The server uses
    the config dir's, removes the old one and says so; nothing is lost or doubled."""
    cache, config = tmp_path / "cache", tmp_path / "config"
    cache.mkdir()
    config.mkdir()
    entry = json.dumps({"Half-Moved": {"recipe": "llamacpp", "checkpoint": "someone/Half-GGUF:Q4_0"}})
    for folder in (cache, config):
        (folder / "user_models.json").write_text(entry)
    srv = make_server(cache=cache, env={"LEMONADE_CONFIG_DIR": str(config)})
    with srv.client() as c:
        ids = [m["id"] for m in c.get("/v1/models", params={"show_all": True}).json()["data"]]
    assert ids.count("Half-Moved") == 1
    assert not (cache / "user_models.json").exists() and (config / "user_models.json").read_text() == entry
    assert "Finished moving user_models.json" in srv.log()


# ----- the guide's examples, as written ----------------------------------------------------------

GUIDE_SETS = [
    ["config", "set", "port=9000", "log_level=debug"],
    ["config", "set", "llamacpp.backend=rocm"],
    ["config", "set", "port=9000", "llamacpp.backend=rocm", "sdcpp.steps=30"],
    ["config", "set", 'telemetry.otlp.semantics=["openinference"]'],
    ["config", "set", 'telemetry.otlp.headers={"Authorization":"Bearer key"}'],
    ["config", "set", "host=0.0.0.0"],
    ["config", "set", "max_loaded_models=2"],  # multi-model guide: max_loaded_models=N
    ["config", "set", "auto_evict=true"],
    ["config", "set", "auto_evict_threshold_pct=0.90"],
    ["config", "set", "llamacpp.vulkan_bin=latest"],
    ["config", "set", "llamacpp.vulkan_bin=b8664"],
    ["config", "set", "llamacpp.vulkan_bin={own_build}"],  # the guide's /home/me/llama.cpp/build/bin
    ["config", "set", "llamacpp.vulkan_bin=builtin"],
]


def test_the_guides_config_commands(make_server, tmp_path):
    own_build = tmp_path / "llama.cpp" / "build" / "bin"
    own_build.mkdir(parents=True)
    srv = make_server()
    for args in GUIDE_SETS:
        proc = cli(*[a.replace("{own_build}", str(own_build)) for a in args], url=srv.url)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    shown = cli("config", url=srv.url)  # "View all current settings": by section, keys dotted as `set` takes them
    assert shown.returncode == 0 and re.search(r"^  sdcpp\.steps +30$", shown.stdout, re.M), shown.stdout
    assert json.loads(cli("config", "get", url=srv.url).stdout)["sdcpp"]["steps"] == 30
    with srv.client() as c:
        params = c.get("/v1/params").json()
    assert params["log_level"] == "debug" and params["llamacpp"]["backend"] == "rocm"
    assert params["telemetry"]["otlp"]["semantics"] == ["openinference"]
    assert params["telemetry"]["otlp"]["headers"] == {"Authorization": "Bearer key"}
    assert params["max_loaded_models"] == 2 and params["auto_evict"] is True
    assert params["auto_evict_threshold_pct"] == 0.9 and params["llamacpp"]["vulkan_bin"] == "builtin"
    saved = json.loads((srv.config_dir / "config.json").read_text())
    assert saved["port"] == 9000 and saved["host"] == "0.0.0.0"  # applies at the next start
    assert "ctx_size" not in saved and "offline" not in saved  # sparse: only what was set


# The example config.json of guide-configuration-README.md, as printed there. Sections of engines this
# server does not have (acestep, flm, ...) and keys it does not use are skipped with a warning that
# names them; everything it knows takes effect.
GUIDE_EXAMPLE_CONFIG = {
    "acestep": {"backend": "auto", "cuda_bin": "builtin", "rocm_bin": "builtin", "vulkan_bin": "builtin"},
    "auto_check_model_updates": True, "broadcast": True, "cloud_providers": [], "config_version": 2,
    "ctx_size": -1, "default_model_source": "huggingface", "disable_model_filtering": False,
    "enable_dgpu_gtt": False, "extra_models_dir": "", "flm": {"args": "", "prefer_system": False},
    "global_timeout": 600, "host": "localhost", "inhibit_suspend": True, "kokoro": {"cpu_bin": "builtin"},
    "llamacpp": {"args": "", "backend": "auto", "cpu_args": "", "cpu_bin": "builtin", "cuda_bin": "builtin",
                 "prefer_system": True, "rocm_args": "", "rocm_bin": "builtin", "vulkan_args": "",
                 "vulkan_bin": "builtin"},
    "log_level": "info", "max_loaded_models": 1, "models_dir": "auto",
    "moonshine": {"args": "", "cpu_args": "", "cpu_bin": "builtin"}, "no_fetch_executables": False,
    "offline": False, "onnxruntime": {"args": "", "cpu_args": "", "cpu_bin": "builtin"},
    "openmoss": {"backend": "auto", "cuda_bin": "builtin", "rocm_bin": "builtin", "vulkan_bin": "builtin"},
    "port": 13305, "rocm_channel": "stable", "rocm_install_method": "auto", "ryzenai": {"server_bin": "builtin"},
    "sdcpp": {"args": "", "backend": "auto", "cfg_scale": 7.0, "cpu_args": "", "cpu_bin": "builtin", "cuda_args": "",
              "cuda_bin": "builtin", "height": 512, "rocm_args": "", "rocm_bin": "builtin", "steps": 20,
              "vulkan_args": "", "vulkan_bin": "builtin", "width": 512},
    "telemetry": {"enabled": False, "hide_inputs": False, "hide_outputs": False, "hide_thinking": False,
                  "max_queue_capacity": 1000,
                  "otlp": {"batch_timeout_s": 1.0, "endpoint": "http://localhost:4318/v1/traces", "headers": {},
                           "max_retries": 0, "protocol": "http/protobuf", "retry_backoff_base_s": 5.0,
                           "semantics": ["openinference", "otel_genai"], "send_batch_size": 100},
                  "session": {"headers": {"client": [], "id": []}}, "trust_incoming_trace_context": False},
    "thenoise": {"backend": "auto", "lora_dir": "", "upscaler_dir": ""},
    "thinksound": {"backend": "auto", "cuda_bin": "builtin", "rocm_bin": "builtin", "vulkan_bin": "builtin"},
    "trellis": {"args": "", "backend": "auto", "cuda_bin": "builtin", "rocm_bin": "builtin", "vulkan_bin": "builtin"},
    "vllm": {"args": "", "backend": "auto"}, "websocket_port": "auto",
    "whispercpp": {"args": "", "backend": "auto", "cpu_args": "", "cpu_bin": "builtin", "npu_args": "",
                   "npu_bin": "builtin"},
}


# A user's tuning in the keys of that example: backend-specific engine flags, the llama.cpp device,
# inhibit_suspend (the example prints them empty or at their defaults).
TUNED = {"inhibit_suspend": False,
         "llamacpp": {"cpu_args": "--no-warmup", "vulkan_args": "-ub 64", "rocm_args": "-b 512", "device": ""},
         "sdcpp": {"cpu_args": "--vae-tiling", "vulkan_args": "--diffusion-fa", "rocm_args": "", "cuda_args": ""},
         "whispercpp": {"cpu_args": "-bs 5", "npu_args": ""}}


def test_the_guides_example_config_json(make_server, gemma_dir):
    """A Lemonade user's config.json with every key of the guide starts this server: what it uses takes
    effect, what it does not have is named in one warning, and no key is lost when the server
    writes the file again."""
    example = deep_merge(GUIDE_EXAMPLE_CONFIG, TUNED)
    srv = make_server(config=example, env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    with srv.client() as c:
        params = c.get("/v1/params").json()
        assert params["global_timeout"] == 600 and params["models_dir"] == "auto"
        assert params["llamacpp"]["prefer_system"] is True and params["sdcpp"]["steps"] == 20
        assert {k: v for k, v in params["llamacpp"].items() if k in TUNED["llamacpp"]} == TUNED["llamacpp"]
        assert {k: params[s][k] for s in ("sdcpp", "whispercpp") for k in TUNED[s]} == \
            {k: v for s in ("sdcpp", "whispercpp") for k, v in TUNED[s].items()}
        assert params["inhibit_suspend"] is False
        # "models_dir": "auto" follows the Hugging Face cache, so the pinned model list still works
        assert c.get("/v1/models").status_code == 200
        reply = c.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 4,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        assert "--no-warmup" in loaded(c)[GEMMA_NAME]["launch_command"]  # cpu_args: the backend in use
        # Kokoro runs on kokoro-onnx here: its one *_bin value is builtin, and another one says why
        assert params["kokoro"]["cpu_bin"] == "builtin" and params["whispercpp"]["cpu_bin"] == "builtin"
        refused = c.post("/v1/params", json={"kokoro": {"cpu_bin": "/usr/local/bin"}})
        assert refused.status_code == 400 and "kokoro-onnx" in refused.text, refused.text
        assert c.post("/internal/set", json={"max_loaded_models": 2}).status_code == 200  # the file is written
    warning = next(line for line in srv.log().splitlines() if "Ignoring settings in" in line)
    assert "acestep.backend" in warning and "flm.args" in warning and "they stay in the file" in warning
    assert "kokoro" not in warning and "sdcpp.cpu_bin" not in warning and "whispercpp.cpu_bin" not in warning
    for key in flatten(TUNED):
        assert key not in warning, key
    on_disk = json.loads((srv.config_dir / "config.json").read_text())
    assert flatten(on_disk) == {**flatten(example), "max_loaded_models": 2}  # every key kept, as written


# ----- GET/POST /v1/params --------------------------------------------------------------------------

def test_params_are_live_and_never_written(make_server):
    srv = make_server()
    path = srv.config_dir / "config.json"
    with srv.client() as c:
        params = c.get("/api/v1/params").json()
        for key in ("global_timeout", "no_fetch_executables", "disable_model_filtering", "auto_evict_threshold_pct"):
            assert key in params, key
        resp = c.post("/api/v1/params", json={"llamacpp_args": "--threads 2", "max_loaded_models": 3,
                                              "telemetry": {"enabled": False}})
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"status": "success", "updated": {"llamacpp": {"args": "--threads 2"},
                                                                "max_loaded_models": 3,
                                                                "telemetry": {"enabled": False}}}
        assert c.get("/v1/params").json()["llamacpp"]["args"] == "--threads 2"
        assert c.get("/v1/health").json()["max_models"]["llm"] == 3  # applied live
        assert not path.exists()  # never written
        # A persisted change of the same key replaces the live one; the answer is nested like the request.
        resp = c.post("/internal/set", json={"max_loaded_models": 2})
        assert resp.json()["updated"] == {"max_loaded_models": 2}
        assert c.get("/v1/params").json()["max_loaded_models"] == 2
    srv.stop()
    again = make_server(cache=srv.cache)
    with again.client() as c:
        params = c.get("/v1/params").json()
    assert params["llamacpp"]["args"] == "" and params["max_loaded_models"] == 2  # live values gone, saved kept


def test_params_what_runs_needs_the_admin_key_and_paths_stay_hidden(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_API_KEY": "user-key", "LEMONADE_ADMIN_API_KEY": "admin-key",
                           "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
    user, admin = {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer admin-key"}
    with srv.client() as c:
        assert c.get("/v1/params").status_code == 401
        seen = c.get("/v1/params", headers=user).json()
        assert seen["extra_models_dir"] == "<extra_models_dir>" and str(gemma_dir) not in json.dumps(seen)
        assert c.get("/v1/params", headers=admin).json()["extra_models_dir"] == str(gemma_dir)
        # What decides what runs, what it reads and where requests go stays the admin's: engine flags and
        # binaries, folders, the peers that requests are forwarded to
        for body in ({"llamacpp_args": "--threads 2"}, {"llamacpp": {"cpu_bin": "/tmp"}}, {"models_dir": "/tmp"},
                     {"max_loaded_models": 3, "whispercpp": {"args": "-t 2"}}, {"peers": ["http://10.9.9.9:13305"]}):
            refused = c.post("/v1/params", json=body, headers=user)
            assert refused.status_code == 403 and "admin key" in refused.json()["error"], body
            assert any(word in refused.json()["error"] for word in ("args", "_bin", "models_dir", "peers"))
        assert c.get("/v1/params", headers=user).json()["max_loaded_models"] != 3  # nothing of a refusal applies
        assert c.post("/v1/params", json={"llamacpp_args": "--threads 2"}, headers=admin).status_code == 200
        # ...the other settings are any API client's, as on Lemonade's server
        changed = c.post("/v1/params", json={"max_loaded_models": 3, "telemetry": {"hide_inputs": True}},
                         headers=user)
        assert changed.status_code == 200, changed.text
        assert changed.json()["updated"] == {"max_loaded_models": 3, "telemetry": {"hide_inputs": True}}
        bad = c.post("/v1/params", json={"telemetry": {"enabled": "yes"}}, headers=user)
        assert bad.status_code == 400 and "enabled" in bad.json()["error"]


@pytest.mark.parametrize(("body", "needle"), [
    ({"telemetry": {"enabled": "yes"}}, "enabled"),
    ({"telemetry": {"otlp": {"endpoint": 123}}}, "endpoint"),
    ({"telemetry": {"otlp": {"headers": "Bearer token"}}}, "headers"),
    ({"telemetry": {"otlp": {"protocol": "http/xml"}}}, "protocol"),
    ({"telemetry": {"otlp": {"semantics": "openinference"}}}, "semantics"),
    ({"telemetry": {"otlp": {"semantics": ["openinference", "custom_fmt"]}}}, "semantics"),
    ({"telemetry": {"unknown_field": True}}, "unknown_field"),
    ({"llamacpp_args": "--threads 2", "llamacpp": {"args": "--threads 3"}}, "Ambiguous"),
    ({"auto_evict_threshold_pct": 2}, "auto_evict_threshold_pct"),
    ({}, "non-empty JSON object"),
    ([1, 2], "non-empty JSON object"),
])
def test_params_refusals_name_the_key(module_servers, body, needle):
    """As Lemonade's own tests read them: 400 and `error` a string naming the key; nothing changes."""
    srv = module_servers()
    with srv.client() as c:
        before = c.get("/v1/params").json()
        resp = c.post("/v1/params", json=body)
        assert resp.status_code == 400 and needle in resp.json()["error"], resp.text
        assert c.get("/v1/params").json() == before


# ----- hardware-based model filtering ----------------------------------------------------------------

def test_models_too_big_for_this_machine_are_not_offered(make_server):
    srv = make_server()
    with srv.client() as c:
        info = c.get("/v1/system-info").json()
        ram_gb = float(info["Physical Memory"].split()[0])
        gpus = [g for kind in ("amd_gpu", "nvidia_gpu", "intel_gpu") for g in info["devices"][kind]]
        pools = [max(g.get("vram_gb", 0), g.get("virtual_mem_gb", 0)) if g.get("integrated") else g.get("vram_gb", 0)
                 for g in gpus]
        everything = {m["id"]: m for m in c.get("/v1/models", params={"show_all": True}).json()["data"]}
        assert c.post("/v1/params", json={"disable_model_filtering": True}).status_code == 200
        unfiltered = {m["id"]: m for m in c.get("/v1/models", params={"show_all": True}).json()["data"]}
        big = {"model_name": "user.Huge", "recipe": "llamacpp", "checkpoint": "someone/Huge-GGUF:Q4_0",
               "size": 10_000.0}
        assert c.post("/v1/models/register", json=big).status_code == 200
        c.post("/v1/params", json={"disable_model_filtering": False})
        filtered_again = {m["id"] for m in c.get("/v1/models", params={"show_all": True}).json()["data"]}
    # The larger of 80 % of RAM and the biggest GPU memory pool (catalog/fit.py; none on a CPU-only machine)
    limit = max([0.8 * ram_gb] + pools)
    hidden = set(unfiltered) - set(everything)
    assert hidden, f"every built-in model fits {ram_gb} GB"  # the catalog has models of 24 and 45 GB
    assert all(unfiltered[m]["size"] > limit - 0.1 and not unfiltered[m]["downloaded"] for m in hidden)
    assert all(m.get("size", 0) <= limit + 0.1 or m["downloaded"] for m in everything.values()
               if "components" not in m and "cloud_provider" not in m and not m["id"].startswith("user."))
    assert "Huge" in filtered_again  # a model the user registered is their call


# ----- memory-pressure eviction on the machine's real memory reading ----------------------------------

def test_memory_pressure_evicts_an_unpinned_auto_evict_model(make_server, gemma_dir):
    """A threshold of 1 % that this machine's real memory use (RAM here: no GPU memory to read) is
    above, so the first reading after the load evicts the model; a pinned one stays however often the
    monitor reads."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                      config={"auto_evict": True, "auto_evict_threshold_pct": 0.01})
    with srv.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "pinned": True}).status_code == 200
        start = c.get("/v1/health").json()["queue"]["pressure_samples_total"]
        wait_for(lambda: c.get("/v1/health").json()["queue"]["pressure_samples_total"] >= start + 2)
        assert GEMMA_NAME in loaded(c)  # pinned: never pressure-evicted
        assert c.post("/internal/pin", json={"model_name": GEMMA_NAME, "pinned": False}).status_code == 200
        wait_for(lambda: GEMMA_NAME not in loaded(c))
        assert c.get("/v1/health").json()["queue"]["pressure_evictions_total"] == 1
    line = next(ln for ln in srv.log().splitlines() if "Memory pressure:" in ln)
    assert "RAM use" in line or "VRAM use" in line
    assert ">= auto_evict_threshold_pct 1 %" in line and GEMMA_NAME in line


def test_memory_pressure_applies_to_a_model_loaded_with_auto_evict(make_server, gemma_dir):
    """auto_evict off server-wide, on for one load (`/v1/load` `auto_evict`): the monitor reads memory
    for that model and evicts it."""
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}, config={"auto_evict_threshold_pct": 0.01})
    with srv.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME, "auto_evict": True}).status_code == 200
        wait_for(lambda: GEMMA_NAME not in loaded(c))
        queue = c.get("/v1/health").json()["queue"]
        assert queue["pressure_samples_total"] >= 1 and queue["pressure_evictions_total"] == 1


# ----- backend binary selection: llamacpp.cpu_bin -------------------------------------------------

def test_cpu_bin_your_own_build_and_back_live(make_server, gemma_dir, llama_backend, tmp_path):
    """`llamacpp.cpu_bin=/path`: the llama-server in that folder is run, never downloaded over, and
    `builtin` switches back live: the loaded model is loaded again on the pinned binary."""
    own = tmp_path / "my-llama" / "build" / "bin"
    own.mkdir(parents=True)
    shutil.copy2(llama_backend / "llama-server", own / "llama-server")
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                      config={"llamacpp": {"cpu_bin": str(own), "backend": "cpu"}})
    with srv.client() as c:
        cpu = c.get("/v1/system-info").json()["recipes"]["llamacpp"]["backends"]["cpu"]
        assert cpu["state"] == "installed" and str(own) in cpu["message"]
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
        assert loaded(c)[GEMMA_NAME]["launch_command"][0] == str(own / "llama-server")
        pid = loaded(c)[GEMMA_NAME]["pid"]
        refused = c.post("/v1/uninstall", json={"recipe": "llamacpp", "backend": "cpu"})
        assert refused.status_code == 400 and "does not remove it" in refused.json()["error"]["message"]
        assert c.post("/internal/set", json={"llamacpp": {"cpu_bin": "builtin"}}).status_code == 200
        wait_for(lambda: loaded(c).get(GEMMA_NAME, {}).get("pid") not in (None, pid))
        assert loaded(c)[GEMMA_NAME]["launch_command"][0] == str(srv.cache / "backends" / "llamacpp" / "cpu"
                                                                  / "llama-server")
    assert (own / "llama-server").is_file()


@pytest.fixture
def release_mirror(llama_backend, tmp_path) -> Iterator[tuple[str, str]]:
    """A local stand-in for GitHub: the releases API's `latest` answer and a release archive in the
    official layout (`llama-<tag>-bin-ubuntu-x64.tar.gz` holding `build/bin/`). The binaries in it are
    the test cache's build of the pinned llama.cpp, so the tag they report is the pinned one."""
    from lemonade.backends.llamacpp.build import LLAMA_CPP_VERSION as TAG
    from lemonade.backends.llamacpp.build import release_asset_name

    root = tmp_path / "mirror"
    (root / TAG).mkdir(parents=True)
    (root / "latest").write_text(json.dumps({"tag_name": TAG, "name": TAG}))
    asset = release_asset_name(TAG)
    with tarfile.open(root / TAG / asset, "w:gz") as tar:
        for name in ("llama-server", "ggml-rpc-server"):
            tar.add(llama_backend / name, arcname=f"build/bin/{name}")
    # The digest GitHub's release API states for the asset (no pin covers another tag's archive).
    tags = root / "repos" / "ggml-org" / "llama.cpp" / "releases" / "tags"
    tags.mkdir(parents=True)
    digest = hashlib.sha256((root / TAG / asset).read_bytes()).hexdigest()
    (tags / TAG).write_text(json.dumps({"tag_name": TAG, "assets": [{"name": asset, "digest": f"sha256:{digest}"}]}))

    with served_folder(root) as url:
        yield url, TAG


def test_cpu_bin_latest_and_a_pinned_tag_install_from_the_release(make_server, gemma_dir, release_mirror):
    url, tag = release_mirror
    env = {"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir), "LEMONADE_LLAMACPP_RELEASE_BASE_URL": url,
           "LEMONADE_LLAMACPP_LATEST_URL": url + "/latest", "LEMONADE_GITHUB_API_URL": url}
    srv = make_server(env=env, config={"llamacpp": {"cpu_bin": "latest", "backend": "cpu"}})
    installed = srv.cache / "backends" / "llamacpp" / f"cpu@{tag}"
    with srv.client() as c:
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200  # installs on first use
        assert loaded(c)[GEMMA_NAME]["launch_command"][0] == str(installed / "llama-server")
        assert json.loads((installed / "install.json").read_text())["version"] == tag
        # A tag the mirror does not have: the load says which release could not be downloaded.
        assert c.post("/internal/set", json={"llamacpp": {"cpu_bin": "b1"}}).status_code == 200
        wait_for(lambda: GEMMA_NAME not in loaded(c) or loaded(c)[GEMMA_NAME]["launch_command"][0]
                 != str(installed / "llama-server"))
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME})
        assert resp.status_code == 500 and "llama.cpp b1" in resp.json()["error"]["message"], resp.text
        # The tag itself, pinned: already installed, loads at once; no_fetch_executables does not matter.
        c.post("/internal/set", json={"llamacpp": {"cpu_bin": tag}, "no_fetch_executables": True})
        assert c.post("/v1/load", json={"model_name": GEMMA_NAME}).status_code == 200
        assert loaded(c)[GEMMA_NAME]["launch_command"][0] == str(installed / "llama-server")
    assert "the newest llama.cpp release is " + tag in srv.log()


def test_latest_runs_what_is_installed_and_offers_the_newer_release():
    from lemonade.backends.bin_select import LatestTag, release_order

    assert release_order("b8664") == (8664,) and release_order("v1.8.5") == (1, 8, 5)
    assert release_order("master-820-de298c2") == (820,) < release_order("master-900-abcdef1")
    latest = LatestTag("llama.cpp", lambda: "b200")
    assert latest.choose("k", False, []) == ("b200", None)  # none installed: install the newest on first use
    assert latest.choose("k", False, ["b100"]) == ("b100", "b200")  # keep running, offer the update
    assert latest.choose("k", False, ["b200", "b100"]) == ("b200", None)
    assert latest.choose("k", False, ["b300"]) == ("b300", None)  # never a downgrade
    offline = LatestTag("llama.cpp", lambda: "b200")
    assert offline.choose("k", True, ["b100"]) == ("b100", None) and offline.choose("k", True, []) == (None, None)
    assert "offline" in offline.reason


def test_no_fetch_executables_refuses_to_download_an_engine(make_server, gemma_dir):
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)}, engines=(),
                      config={"no_fetch_executables": True, "llamacpp": {"backend": "cpu"}})
    with srv.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME})
        assert resp.status_code == 400 and "no_fetch_executables" in resp.json()["error"]["message"], resp.text
        resp = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "cpu"})
        assert resp.status_code == 400 and "no_fetch_executables" in resp.json()["error"]["message"], resp.text
    assert not (srv.cache / "backends" / "llamacpp" / "cpu").exists()


# ----- exposed without a key ----------------------------------------------------------------------------

def test_startup_warning_when_bound_beyond_loopback_without_a_key(make_server):
    exposed = make_server(args=["--host", "0.0.0.0"])
    keyed = make_server(args=["--host", "0.0.0.0"], env={"LEMONADE_API_KEY": "k"})
    local = make_server()
    assert "without LEMONADE_API_KEY" in exposed.log() and "0.0.0.0" in exposed.log()
    assert "without LEMONADE_API_KEY" not in keyed.log()
    assert "without LEMONADE_API_KEY" not in local.log()


def test_global_timeout_bounds_an_engine_start(make_server, gemma_dir, llama_backend, tmp_path):
    """An engine that never answers its health check fails the load after global_timeout seconds,
    naming it, instead of the default 600 s. The engine is a hung one: a wrapper (selected with
    cpu_bin) around the real llama-server that, once started, only sleeps: the code path of a start
    that never becomes ready, which a healthy llama-server cannot show."""
    own = tmp_path / "silent"
    own.mkdir()
    # The real llama-server answers --version and --help (its flags are checked); a start never answers.
    real = llama_backend / "llama-server"
    (own / "llama-server").write_text(f'#!/bin/sh\ncase "$1" in --version|--help) exec "{real}" "$@";; esac\n'
                                      "exec sleep 600\n")
    (own / "llama-server").chmod(0o755)
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                      config={"global_timeout": 3, "llamacpp": {"cpu_bin": str(own), "backend": "cpu"}})
    with srv.client() as c:
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME})
    assert resp.status_code == 500 and "did not become ready within 3s" in resp.json()["error"]["message"], resp.text

