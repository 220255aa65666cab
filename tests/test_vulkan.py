"""The GPU path for real: llama.cpp's `vulkan` backend serves Gemma 3 270M with every layer offloaded.

On a machine without a GPU, Mesa's software Vulkan driver (lavapipe, Debian `mesa-vulkan-drivers`)
is the Vulkan device: the backend is installed with `force` (no GPU passes the hardware filter),
built from the pinned sources with `-DGGML_VULKAN=ON` when GitHub's release archive is unreachable,
and llama-server's own log must say the layers went to the Vulkan device. With a real GPU the same
test runs without `force` and the model's health `device` is "gpu".

Part of every run: `.ci/run` installs Debian's mesa-vulkan-drivers libvulkan-dev glslc
spirv-headers vulkan-tools and builds the backend into the test cache before the suite
(tests/vulkan_sdk.py; a cold build took 27 minutes on this project's 2 shared cores at load 17, the
CPU build's ccache covering ggml-cpu, llama, common and the server; docs/performance.md), so here it
is only loaded. Run alone on a machine without the build, the fixture builds it first.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from lemonade.system.devices import detect_devices
from tests.helpers import GEMMA_NAME, TEST_CACHE, Server, ServerFactory
from tests.vulkan_sdk import ensure_vulkan_backend


@pytest.fixture(scope="module")
def vulkan_backend() -> Path:
    """The vulkan backend installed in the test cache (built once; forced where no GPU passes the filter)."""
    return ensure_vulkan_backend(TEST_CACHE)


@pytest.fixture(scope="module")
def vulkan_server(module_servers: ServerFactory, gemma_dir: Path, vulkan_backend: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Server:
    cache = tmp_path_factory.mktemp("vulkan-cache")
    link = cache / "backends" / "llamacpp" / "vulkan"
    link.parent.mkdir(parents=True)
    link.symlink_to(vulkan_backend, target_is_directory=True)
    # debug: the engine's own output goes to the server log too, where the offload lines are read
    return module_servers(cache=cache, engines=("llamacpp",), args=["--log-level", "debug"],
                          env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})


def complete(client: OpenAI) -> str:
    reply = client.completions.create(model=GEMMA_NAME, prompt="The capital of France is the city of",
                                      max_tokens=8, temperature=0)
    assert reply.usage.completion_tokens > 0 and reply.choices[0].text, reply
    return reply.choices[0].text


def test_gemma_served_through_vulkan_with_layers_offloaded(vulkan_server: Server):
    report = detect_devices()
    with vulkan_server.client() as c:
        info = c.get("/v1/system-info").json()
        assert info["recipes"]["llamacpp"]["backends"]["vulkan"]["state"] == "installed"
        assert [v["name"] for v in info["devices"]["vulkan"]] == [v.name for v in report.vulkan]
        # -lv 4: llama-server b11312 prints its load_tensors lines (the offload) only at verbosity 4
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "vulkan", "ctx_size": 1024,
                                        "llamacpp_args": "-lv 4"})
        assert resp.status_code == 200, resp.text

        client = OpenAI(base_url=vulkan_server.url + "/v1", api_key="unused")
        on_vulkan = complete(client)

        [loaded] = c.get("/v1/health").json()["all_models_loaded"]
        assert loaded["recipe_options"]["llamacpp_backend"] == "vulkan"
        argv = loaded["launch_command"]
        assert argv[argv.index("-ngl") + 1] == "99"
        assert loaded["device"] == ("gpu" if report.vulkan_gpus else "cpu")  # lavapipe is the CPU
        [running] = c.get("/api/ps").json()["models"]  # Ollama: GPU memory only on a real GPU
        assert running["size_vram"] == (running["size"] if loaded["device"] == "gpu" else 0) and running["size"] > 0

        # the same greedy completion on the CPU backend: the Vulkan device computed the same thing
        assert c.post("/v1/unload", json={"model_name": GEMMA_NAME}).status_code == 200
        resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "cpu", "ctx_size": 1024})
        assert resp.status_code == 200, resp.text
        on_cpu = complete(client)
        assert on_vulkan.split()[:2] == on_cpu.split()[:2], (on_vulkan, on_cpu)

    log = vulkan_server.log_path.read_text(errors="replace")
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    assert offloaded and offloaded.group(1) == offloaded.group(2) != "0", log[-4000:]
    assert re.search(r"Vulkan0 model buffer size\s*=", log), log[-4000:]
    assert f"using device Vulkan0 ({report.vulkan[0].name})" in log  # the device llama.cpp chose


def test_stats_stay_truthful_on_a_software_device(vulkan_server: Server):
    stats = httpx.get(vulkan_server.url + "/v1/system-stats").json()
    if not detect_devices().gpus:
        assert stats["gpu_percent"] is None and stats["vram_gb"] is None  # lavapipe is no GPU to measure


def test_the_server_wide_device_and_vulkan_args_apply_to_vulkan_loads(vulkan_server: Server):
    """`llamacpp.device` and `llamacpp.vulkan_args` (guide-configuration-README.md) reach llama-server
    when a model runs on the vulkan backend; on the cpu backend its own `cpu_args` apply and no device
    (it has none). Set live with /internal/set, as `lemonade config set` does."""
    settings = {"device": "Vulkan0", "vulkan_args": "-ub 128", "cpu_args": "--no-warmup"}
    with vulkan_server.client() as c:
        assert c.post("/internal/set", json={"llamacpp": settings}).status_code == 200
        try:
            c.post("/v1/unload", json={})
            resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "vulkan", "ctx_size": 1024})
            assert resp.status_code == 200, resp.text
            [loaded] = c.get("/v1/health").json()["all_models_loaded"]
            argv = loaded["launch_command"]
            assert argv[argv.index("--device") + 1] == "Vulkan0" and argv[argv.index("-ub") + 1] == "128"
            assert "--no-warmup" not in argv
            complete(OpenAI(base_url=vulkan_server.url + "/v1", api_key="unused"))

            c.post("/v1/unload", json={})
            resp = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_backend": "cpu", "ctx_size": 1024})
            assert resp.status_code == 200, resp.text
            [loaded] = c.get("/v1/health").json()["all_models_loaded"]
            argv = loaded["launch_command"]
            assert "--no-warmup" in argv and "--device" not in argv and "128" not in argv
        finally:
            c.post("/internal/set", json={"llamacpp": dict.fromkeys(settings, "")})
            c.post("/v1/unload", json={})
