"""Images on stable-diffusion.cpp (`sd-cpp` recipe): a real `sd-server` built from the pinned
stable-diffusion.cpp sources serving `/v1/images/generations`, `/edits`, `/variations`, and a real
`sd-cli` upscaling with Real-ESRGAN for `/v1/images/upscale`.

The models are NOT real Stable Diffusion or Real-ESRGAN weights: those are gigabytes and on no
offline package index, so the local hub serves RANDOM-weight models at real architectures' tensor
names and shapes (`tests/sd_factory.py`): `test-org/tiny-sd1:tiny-sd1.safetensors`, an SD 1.x
checkpoint with the distilled "tiny" UNet (registered as `user.Tiny-SD1`), and the catalog's
`RealESRGAN-x4plus` file as an RRDBNet x4 with 2 blocks instead of 23. sd.cpp loads them, samples,
decodes and writes PNGs; the pictures are noise, so these tests check sizes, formats, determinism,
errors and the engine's process, never what a picture shows. Small sizes and 1 step keep it fast.

Two more layouts prove the catalog's multi-file and SDXL entries reach a working sd-server (random
weights too, `tests/sd_factory.py`): the built-in `Flux-2-Klein-4B` itself, its three files published
at the catalog's repositories and paths (diffusion model and Qwen3 text encoder scaled down where sd.cpp
reads sizes from the tensors, the VAE full size), and `user.Random-SDXL`, an SDXL checkpoint at its real
shapes in SGM naming (a 2.7 GB GGUF with Q4_0 linear weights; the catalog's SDXL files are fp16
safetensors of the same layout).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from PIL import Image

from lemonade.backends.sdcpp.engine import checkpoint_args, edit_body, extra_args, generation_settings, sampler_args
from lemonade.backends.sdcpp.flags import check_sdcpp_args
from lemonade.backends.sdcpp.install import SDCPP_VERSION
from lemonade.model_info import ModelInfo
from tests.helpers import GEMMA_NAME, run_cli, served_folder, wait_for
from tests.helpers import loaded as loaded_by_name
from tests.sd_factory import (
    FLUX2_KLEIN_FILES,
    SD_FILE,
    SD_REPO,
    SDXL_FILE,
    SDXL_REPO,
    publish_sd,
)

MODEL = "user.Tiny-SD1"
ESRGAN = "RealESRGAN-x4plus"  # catalog: amd/realesrgan-x4plus:RealESRGAN_x4plus.pth
FLUX2 = "Flux-2-Klein-4B"  # the catalog's entry, files published at its repositories
SDXL = "user.Random-SDXL"
FAST = {"steps": 1, "cfg_scale": 1.0}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mcp-images")


@pytest.fixture(scope="module")
def server(module_servers, hub_server, sdcpp_backend, gemma_dir, sandbox):
    publish_sd(hub_server)
    srv = module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir),
                              "LEMONADE_MCP_IMAGE_DIR": str(sandbox)},
                         engines=("llamacpp", "sd-cpp"))
    with srv.client() as c:
        resp = c.post("/v1/pull", json={"model_name": MODEL, "checkpoint": f"{SD_REPO}:{SD_FILE}", "recipe": "sd-cpp",
                                        "labels": ["image"]})
        assert resp.status_code == 200, resp.text
    return srv


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=600) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)


def loaded(http) -> dict[str, dict]:
    """Loaded models by name; the user model is listed under its bare name (`Tiny-SD1`)."""
    return {("user." + k if k == MODEL.split(".", 1)[1] else k): v for k, v in loaded_by_name(http).items()}


def png_of(b64: str) -> Image.Image:
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def png_bytes(size: tuple[int, int] = (64, 64), color: tuple[int, int, int] = (200, 120, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def error_of(resp: httpx.Response) -> str:
    return resp.json()["error"]["message"]


# ----- units -------------------------------------------------------------------------------------------
def test_request_settings_travel_as_sd_cpp_extra_args():
    suffix = extra_args(4, 1.5, 7)
    assert suffix.startswith(" <sd_cpp_extra_args>") and suffix.endswith("</sd_cpp_extra_args>")
    assert '"seed": 7' in suffix and '"sample_steps": 4' in suffix and '"txt_cfg": 1.5' in suffix
    body, ctype = edit_body("a cat", [b"\x89PNG"], None, 64, 128, None, None, 3)
    assert ctype.startswith("multipart/form-data; boundary=") and b'name="image[]"' in body and b"64x128" in body


def test_catalog_image_defaults_apply_unless_the_model_has_its_own_options():
    turbo = ModelInfo(name="builtin.SD-Turbo", recipe="sd-cpp", mode="image",
                      image_defaults={"steps": 4, "cfg_scale": 1.0, "width": 512, "height": 512})
    server = {"steps": 20, "cfg_scale": 7.0, "width": 512, "height": 512}
    assert generation_settings(turbo, dict(server), server)["steps"] == 4
    assert generation_settings(turbo, {**server, "steps": 8}, server)["steps"] == 8


def test_multi_file_checkpoints_become_diffusion_model_llm_and_vae():
    flux = ModelInfo(name="builtin.Flux-2-Klein-4B", recipe="sd-cpp", mode="image")
    files = {"main": [Path("/m/flux.safetensors")], "text_encoder": [Path("/m/qwen.safetensors")],
             "vae": [Path("/m/vae.safetensors")]}
    assert checkpoint_args(flux, files) == ["--diffusion-model", "/m/flux.safetensors", "--llm",
                                            "/m/qwen.safetensors", "--vae", "/m/vae.safetensors"]
    assert checkpoint_args(flux, {"main": [Path("/m/sd.safetensors")]}) == ["-m", "/m/sd.safetensors"]


def test_catalog_sampler_defaults_under_the_load_options(tmp_path):
    """Qwen-Image's entry is a flow model sampled with euler (its image_defaults); the load options
    `sampling_method` and `flow_shift` replace them."""
    from lemonade.catalog.catalog import Catalog

    qwen = Catalog(tmp_path).resolve("Qwen-Image-GGUF")
    assert sampler_args(qwen, {}) == ["--sampling-method", "euler", "--flow-shift", "3.0"]
    assert sampler_args(qwen, {"sampling_method": "dpm++2m", "flow_shift": 1.5}) == [
        "--sampling-method", "dpm++2m", "--flow-shift", "1.5"]
    assert sampler_args(Catalog(tmp_path).resolve("SD-Turbo"), {}) == []


def test_sdcpp_args_flags_by_who_sets_them():
    """Per model or request: sd-server flags that touch no file (the catalog's memory flags are such);
    the admin's server-wide `sdcpp.args`: also flags naming files; nobody: what Lemonade sets, or a
    flag the pinned sd-server does not know (it would exit at start)."""
    from lemonade.runtime.options import OptionsError, validate_option

    assert validate_option("sd-cpp", "sdcpp_args", "--diffusion-fa --offload-to-cpu -t 2") == \
        "--diffusion-fa --offload-to-cpu -t 2"
    with pytest.raises(OptionsError, match="--lora-model-dir.*sdcpp.args"):
        validate_option("sd-cpp", "sdcpp_args", "--vae-tiling --lora-model-dir /")
    assert check_sdcpp_args("--lora-model-dir /loras", trusted=True) == ["--lora-model-dir", "/loras"]
    for flag in ("--listen-port 9", "-m /x.gguf", "--steps 3"):
        with pytest.raises(ValueError, match="Lemonade sets"):
            check_sdcpp_args(flag, trusted=True)
    with pytest.raises(ValueError, match="not a flag sd-server"):
        check_sdcpp_args("--no-such-flag", trusted=True)
    # the backends sdcpp.backend takes (the descriptor's: cuda is upstream's, unsupported in this build)
    with pytest.raises(OptionsError, match="sd-cpp_backend' must be one of auto, cpu, vulkan, rocm, cuda"):
        validate_option("sd-cpp", "sd-cpp_backend", "cuda12")


# ----- the engine ----------------------------------------------------------------------------------------
def test_system_info_shows_sdcpp_installed(http):
    cpu = http.get("/v1/system-info").json()["recipes"]["sd-cpp"]["backends"]["cpu"]
    assert cpu["state"] == "installed" and cpu["version"] == SDCPP_VERSION


def test_generate_with_the_official_client_same_seed_same_bytes(client, http):
    first = client.images.generate(model=MODEL, prompt="a lemon on a table", size="64x64",
                                   extra_body={**FAST, "seed": 42})
    assert len(first.data) == 1 and png_of(first.data[0].b64_json).size == (64, 64)
    again = client.images.generate(model=MODEL, prompt="a lemon on a table", size="64x64",
                                   extra_body={**FAST, "seed": 42})
    assert again.data[0].b64_json == first.data[0].b64_json
    wide = client.images.generate(model=MODEL, prompt="a lemon", size="128x64", extra_body=FAST)
    assert png_of(wide.data[0].b64_json).size == (128, 64)
    lm = loaded(http)[MODEL]
    assert lm["type"] == "image" and lm["recipe"] == "sd-cpp" and psutil.pid_exists(lm["pid"])
    assert "sd-server" in lm["launch_command"][0]


def test_edit_and_variation_with_the_official_client(client):
    masked = client.images.edit(model=MODEL, image=("in.png", png_bytes(), "image/png"), prompt="a hat",
                                mask=("mask.png", png_bytes(color=(255, 255, 255)), "image/png"), size="64x64",
                                user="u1", extra_body={**FAST, "seed": 1, "quality": "high", "input_fidelity": "low"})
    assert png_of(masked.data[0].b64_json).size == (64, 64)
    varied = client.images.create_variation(model=MODEL, image=("in.png", png_bytes(), "image/png"), size="64x64",
                                            n=2, extra_body={**FAST, "seed": 5})
    assert len(varied.data) == 2 and varied.data[0].b64_json != varied.data[1].b64_json
    assert all(png_of(d.b64_json).size == (64, 64) for d in varied.data)


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "size": "65x64"}, "size"),
    ({"prompt": "x", "size": "big"}, "size"),
    ({"prompt": "x", "size": "4096x4096"}, "size"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 11}, "n"),
    ({"prompt": "x", "n": "two"}, "n"),
    ({"prompt": "x", "response_format": "url"}, "response_format"),
    ({"prompt": "x", "steps": 0}, "steps"),
    ({"prompt": "x", "steps": 101}, "steps"),
    ({"prompt": "x", "cfg_scale": -1}, "cfg_scale"),
    ({"prompt": "x", "seed": "abc"}, "seed"),
    ({}, "prompt"),
    ({"prompt": "   "}, "prompt"),
])
def test_bad_generation_requests_are_400_naming_the_field(http, body, field):
    resp = http.post("/v1/images/generations", json={"model": MODEL, **body})
    assert resp.status_code == 400, resp.text
    assert f"'{field}'" in error_of(resp)
    if field == "response_format":
        assert "b64_json" in error_of(resp)


def test_generation_model_errors(http):
    assert http.post("/v1/images/generations", json={"prompt": "x"}).status_code == 400
    unknown = http.post("/v1/images/generations", json={"model": "no-such-model", "prompt": "x"})
    assert unknown.status_code == 404
    llm = http.post("/v1/images/generations", json={"model": GEMMA_NAME, "prompt": "x"})
    assert llm.status_code == 400 and "cannot serve /images/generations" in error_of(llm)
    upscaler = http.post("/v1/images/generations", json={"model": ESRGAN, "prompt": "x"})
    assert upscaler.status_code == 400 and "/images/upscale" in error_of(upscaler)


@pytest.mark.parametrize("route, data, files, field", [
    ("edits", {"prompt": "x", "n": "0"}, True, "n"),
    ("edits", {"prompt": "x", "n": "11"}, True, "n"),
    ("edits", {"prompt": "x"}, False, "image"),
    ("edits", {}, True, "prompt"),
    ("edits", {"prompt": "x", "size": "100x100"}, True, "size"),
    ("edits", {"prompt": "x", "response_format": "url"}, True, "response_format"),
    ("variations", {"n": "11"}, True, "n"),
    ("variations", {}, False, "image"),
])
def test_bad_edit_and_variation_requests_are_400(http, route, data, files, field):
    parts = {"image": ("in.png", png_bytes(), "image/png")} if files else {"unused": ("x.txt", b"x", "text/plain")}
    resp = http.post(f"/v1/images/{route}", data={"model": MODEL, **data}, files=parts)
    assert resp.status_code == 400, resp.text
    assert f"'{field}'" in error_of(resp)


def test_an_upload_that_is_not_an_image_is_refused(http):
    resp = http.post("/v1/images/edits", data={"model": MODEL, "prompt": "x"},
                     files={"image": ("in.png", b"GIF89a not a png", "image/png")})
    assert resp.status_code == 400 and "not a PNG" in error_of(resp)


# ----- upscale ----------------------------------------------------------------------------------------------
def test_upscale_is_4x(http):
    source = base64.b64encode(png_bytes((32, 24))).decode()
    resp = http.post("/v1/images/upscale", json={"model": ESRGAN, "image": source})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert isinstance(body["created"], int) and png_of(body["data"][0]["b64_json"]).size == (128, 96)


@pytest.mark.parametrize("body, status, message", [
    ({"model": ESRGAN}, 400, "Missing 'image' field (base64 encoded)"),
    ({"image": "aGVsbG8="}, 400, "Missing 'model' field"),
    ({"image": "aGVsbG8=", "model": "bad-model"}, 404, "Upscale model not found: bad-model"),
    ({"image": "aGVsbG8=", "model": MODEL}, 404, f"Upscale model not found: {MODEL}"),
])
def test_upscale_error_table(http, body, status, message):
    resp = http.post("/v1/images/upscale", json=body)
    assert resp.status_code == status
    assert resp.json()["error"] == {**resp.json()["error"], "message": message, "type": "invalid_request_error"}


def test_upscale_refuses_bad_base64_and_non_images(http):
    assert "'image'" in error_of(http.post("/v1/images/upscale", json={"model": ESRGAN, "image": "%%%"}))
    resp = http.post("/v1/images/upscale", json={"model": ESRGAN, "image": "aGVsbG8="})
    assert resp.status_code == 400 and "not a PNG" in error_of(resp)


def test_registered_image_model_keeps_its_defaults_and_options(http):
    """A registration as Lemonade's app writes one: `image_defaults` and sd-cpp `recipe_options`
    (backend, sd-server flags, sampler). The model's info shows both as its recipe options, defaults
    under options; it is labelled `custom` and `image`; a load runs sd-server with every one of them."""
    name = "user.Tiny-SD1-Tuned"
    body = {"model_name": name, "checkpoint": f"{SD_REPO}:{SD_FILE}", "recipe": "sd-cpp",
            "image_defaults": {"steps": 3, "cfg_scale": 1.5, "width": 128, "height": 64, "sampling_method": "euler"},
            "recipe_options": {"sd-cpp_backend": "cpu", "sdcpp_args": "--vae-tiling", "width": 64, "flow_shift": 2.0}}
    resp = http.post("/v1/pull", json=body)
    assert resp.status_code == 200, resp.text
    try:
        obj = http.get(f"/v1/models/{name}").json()
        assert obj["labels"] == ["custom", "image"]
        assert obj["recipe_options"] == {"steps": 3, "cfg_scale": 1.5, "width": 64, "height": 64,
                                         "sampling_method": "euler", "sd-cpp_backend": "cpu",
                                         "sdcpp_args": "--vae-tiling", "flow_shift": 2.0}
        refused = http.post("/v1/pull", json={**body, "recipe_options": {"sdcpp_args": "--lora-model-dir /"}})
        assert refused.status_code == 400 and "--lora-model-dir" in refused.json()["error"]
        assert http.post("/v1/load", json={"model_name": name}).status_code == 200
        argv = loaded(http)[name.removeprefix("user.")]["launch_command"]
        joined = " ".join(argv)
        for part in ("--steps 3", "--cfg-scale 1.5", "-W 64", "-H 64", "--sampling-method euler",
                     "--flow-shift 2.0", "--vae-tiling"):
            assert part in joined, (part, argv)
    finally:
        http.post("/v1/delete", json={"model_name": name})


# ----- residency, other APIs, the CLI ------------------------------------------------------------------
def test_image_model_stays_resident_next_to_the_llm(http):
    # loaded here: a test above loads another image model (one image slot) and deletes it
    assert http.post("/v1/load", json={"model_name": MODEL}).status_code == 200
    assert MODEL in loaded(http)
    chat = http.post("/v1/chat/completions", json={"model": GEMMA_NAME, "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200, chat.text
    now = loaded(http)
    assert now[GEMMA_NAME]["type"] == "llm" and now[MODEL]["type"] == "image"


def test_generation_progress_reaches_the_log_stream(server, http):
    """sd-server's step progress (a bar it redraws with carriage returns) reaches `/logs/stream` line by
    line as live entries, logged while the picture was being made: before the server's own line
    saying the generation finished (the log's sequence numbers order them)."""
    import json

    import websockets.sync.client as ws_client

    steps = 4
    body = {"model": MODEL, "prompt": "a lemon", "size": "64x64", "steps": steps, "cfg_scale": 1.0, "seed": 9}
    live: list[dict] = []
    with ws_client.connect(server.url.replace("http", "ws") + "/logs/stream") as ws:
        ws.send(json.dumps({"type": "logs.subscribe", "after_seq": None}))
        assert json.loads(ws.recv(timeout=30))["type"] == "logs.snapshot"
        resp = http.post("/v1/images/generations", json=body)  # its lines queue up for this subscriber meanwhile
        assert resp.status_code == 200, resp.text
        while not any(e["tag"] == "images" and "1 image(s) of 64x64" in e["line"] for e in live):
            msg = json.loads(ws.recv(timeout=60))
            assert msg["type"] == "logs.entry", msg
            live.append(msg["entry"])
    finished = next(e["seq"] for e in live if e["tag"] == "images" and "1 image(s) of 64x64" in e["line"])
    # sd.cpp's bar: "  |============>        | 1/4 - 2.86s/it", one entry per redraw
    bar = re.compile(rf"\|[=> ]+\| (\d+)/{steps} - ")
    progress = [(e["seq"], int(m.group(1))) for e in live
                if e["tag"] == f"engine.sd-server:{MODEL.split('.', 1)[1]}" and (m := bar.search(e["line"]))]
    assert [step for _, step in progress] == list(range(1, steps + 1)), [e["line"] for e in live][-40:]
    assert all(seq < finished for seq, _ in progress)


def test_ollama_generate_makes_an_image(http):
    resp = http.post("/api/generate", json={"model": MODEL, "prompt": "a lemon", "width": 64, "height": 64,
                                            "steps": 1, "stream": False})
    assert resp.status_code == 200, resp.text
    assert resp.json()["done"] is True and png_of(resp.json()["image"]).size == (64, 64)


def test_mcp_generate_image_writes_into_the_sandbox(server, sandbox):
    from mcp import Client

    async def run():
        async with Client(server.url + "/mcp", read_timeout_seconds=300) as c:
            return await c.call_tool("lemonade_generate_image", {"model": MODEL, "prompt": "a lemon car",
                                                                  "size": "64x64", "steps": 1, "seed": 3,
                                                                  "output_path": "cars/lemon.png"})

    result = asyncio.run(run())
    assert result.is_error is False, result
    path = Path(result.content[0].text)
    assert path == (sandbox / "cars" / "lemon.png").resolve() and Image.open(path).size == (64, 64)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_cli_generate_and_upscale(server, tmp_path):
    env = {**os.environ, "LEMONADE_CACHE_DIR": str(server.cache), "LEMONADE_CONFIG_DIR": str(server.config_dir)}
    cli = [sys.executable, "-m", "lemonade.cli.main"]
    out = tmp_path / "cli.png"
    done = subprocess.run([*cli, "generate", "a lemon", "-m", MODEL, "-o", str(out), "--size", "64x64", "--steps", "1",
                           "--port", str(server.port)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Image.open(out).size == (64, 64)
    up = subprocess.run([*cli, "upscale", str(out), "-m", ESRGAN, "--port", str(server.port)], env=env,
                        capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    assert Image.open(tmp_path / "cli-upscaled.png").size == (256, 256)


def test_a_client_that_leaves_stops_the_generation(http, server):
    """sd-server cannot interrupt a running generation, so the server stops its process: the work
    ends at once instead of running to its end for nobody (512x512 at 30 steps takes minutes here)."""
    before = loaded(http)[MODEL]["pid"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/images/generations", timeout=3.0,
                   json={"model": MODEL, "prompt": "x", "size": "512x512", "steps": 30, "cfg_scale": 1.0})
    deadline = time.monotonic() + 30
    while psutil.pid_exists(before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(before) or psutil.Process(before).status() == psutil.STATUS_ZOMBIE
    assert MODEL not in loaded(http)


def test_flux2_klein_loads_its_three_files_and_generates(client, http):
    """The built-in Flux-2-Klein-4B, pulled from the local hub as the catalog names its three files, runs
    as `sd-server --diffusion-model --llm --vae` (sd.cpp takes it for Flux.2 Klein by its tensors) and
    makes a 64x64 picture in 1 step. Random weights at the real names (tests/sd_factory.py)."""
    resp = http.post("/v1/pull", json={"model_name": FLUX2})
    assert resp.status_code == 200, resp.text
    first = client.images.generate(model=FLUX2, prompt="a lemon", size="64x64", extra_body={**FAST, "seed": 5})
    assert png_of(first.data[0].b64_json).size == (64, 64)
    argv = loaded_by_name(http)[FLUX2]["launch_command"]
    for flag, (_repo, name) in zip(("--diffusion-model", "--llm", "--vae"), FLUX2_KLEIN_FILES.values(), strict=True):
        assert argv[argv.index(flag) + 1].endswith(name), argv
    assert "-m" not in argv


def test_sdxl_checkpoint_loads_and_generates(client, http):
    """An SDXL checkpoint at its real shapes (UNet, CLIP-L, OpenCLIP bigG, VAE in SGM naming; random
    weights) registered and pulled like any sd-cpp model: `sd-server -m` loads it as SDXL, 1 step at 64x64."""
    resp = http.post("/v1/pull", json={"model_name": SDXL, "checkpoint": f"{SDXL_REPO}:{SDXL_FILE}",
                                       "recipe": "sd-cpp", "labels": ["image"]})
    assert resp.status_code == 200, resp.text
    picture = client.images.generate(model=SDXL, prompt="a lemon", size="64x64", extra_body={**FAST, "seed": 5})
    assert png_of(picture.data[0].b64_json).size == (64, 64)
    argv = loaded_by_name(http)[SDXL.removeprefix("user.")]["launch_command"]
    assert argv[argv.index("-m") + 1].endswith(SDXL_FILE)


def test_release_archive_install(sdcpp_backend, tmp_path, monkeypatch):
    """The release path: a local mirror laid out like GitHub's downloads holds a zip packed as upstream's
    CI packs it (`zip -j` of the binaries: no Unix modes kept), made from our own build."""
    import zipfile

    from lemonade.backends.sdcpp.install import SdCppInstall, release_asset_name

    asset = release_asset_name()
    if asset is None:
        pytest.skip("upstream publishes no CPU archive for this platform")
    folder = tmp_path / "mirror" / SDCPP_VERSION
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / asset, "w") as zf:
        for exe in ("sd-server", "sd-cli"):
            zf.write(sdcpp_backend / exe, exe)
    # our own build, so pinned by us (release_digests.py): checked before it is unpacked
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({f"{SDCPP_VERSION}/{asset}": hashlib.sha256((folder / asset).read_bytes()).hexdigest()}))
    monkeypatch.setenv("LEMONADE_RELEASE_DIGESTS", str(pins))
    with served_folder(tmp_path / "mirror") as url:
        monkeypatch.setenv("LEMONADE_SDCPP_RELEASE_BASE_URL", url)
        inst = SdCppInstall(tmp_path / "cache")
        assert inst.install_pinned("cpu")["version"] == SDCPP_VERSION
    assert inst.read_install_info("cpu")["source"] == "release" and inst.is_installed("cpu")
    assert os.access(inst.backend_dir("cpu") / "sd-cli", os.X_OK)


NEWER, NEWEST = "master-820-de298c2", "master-900-abcdef1"  # two releases after the pinned one


@pytest.fixture
def sd_releases(tmp_path, sdcpp_backend) -> Iterator[tuple[str, Path]]:
    """A local stand-in for GitHub: the download folders of NEWER and NEWEST (each archive holds our own
    build of the pinned sources, under the name upstream gives that release) and the releases API's
    answers (`latest`, and each tag's asset digests). Yields (its URL, the file `latest` is read from)."""
    import zipfile

    from lemonade.backends.sdcpp.install import release_asset_name, tag_commit

    if release_asset_name() is None:
        pytest.skip("upstream publishes no CPU archive for this platform")
    root = tmp_path / "github"
    releases = root / "repos" / "leejet" / "stable-diffusion.cpp" / "releases"
    (releases / "tags").mkdir(parents=True)
    for tag in (NEWER, NEWEST):
        asset = release_asset_name(tag_commit(tag))
        (root / tag).mkdir()
        with zipfile.ZipFile(root / tag / asset, "w") as zf:
            for exe in ("sd-server", "sd-cli"):
                zf.write(sdcpp_backend / exe, exe)
        digest = hashlib.sha256((root / tag / asset).read_bytes()).hexdigest()
        (releases / "tags" / tag).write_text(json.dumps({"tag_name": tag, "assets": [
            {"name": asset, "digest": f"sha256:{digest}"}]}))
    (releases / "latest").write_text(json.dumps({"tag_name": NEWER}))
    with served_folder(root) as url:
        yield url, releases / "latest"


def sd_release_env(hub_server, url: str) -> dict[str, str]:
    return {**hub_server.env(), "LEMONADE_GITHUB_API_URL": url, "LEMONADE_SDCPP_RELEASE_BASE_URL": url}


def pull_tiny_sd(c: httpx.Client) -> None:
    resp = c.post("/v1/pull", json={"model_name": MODEL, "checkpoint": f"{SD_REPO}:{SD_FILE}", "recipe": "sd-cpp",
                                    "labels": ["image"]})
    assert resp.status_code == 200, resp.text


def test_cpu_bin_latest_a_missing_tag_and_your_own_build(make_server, hub_server, sdcpp_backend, sd_releases,
                                                         tmp_path):
    """`sdcpp.cpu_bin` (guide-configuration-README.md, "Backend binary selection"): `latest` asks
    GitHub's releases API (a local stand-in) which release is the newest and installs its archive on
    first use, beside the pinned build, checked against the digest the API states; a tag the mirror
    lacks fails the load naming it; a folder with your own build is used as it is."""
    url, _ = sd_releases
    publish_sd(hub_server)
    srv = make_server(env=sd_release_env(hub_server, url), engines=(), config={"sdcpp": {"cpu_bin": "latest"}})
    installed = srv.cache / "backends" / "sd-cpp" / f"cpu@{NEWER}"
    with srv.client(timeout=600) as c:
        pull_tiny_sd(c)
        cpu = c.get("/v1/system-info").json()["recipes"]["sd-cpp"]["backends"]["cpu"]
        assert cpu["state"] == "installable" and cpu["version"] == NEWER, cpu
        resp = c.post("/v1/images/generations", json={"model": MODEL, "prompt": "a lemon", "size": "64x64", **FAST})
        assert resp.status_code == 200, resp.text  # installed on first use, then generated
        assert loaded(c)[MODEL]["launch_command"][0] == str(installed / "sd-server")
        assert json.loads((installed / "install.json").read_text())["version"] == NEWER
        assert not (srv.cache / "backends" / "sd-cpp" / "cpu").exists()  # the pinned one was not needed

        assert c.post("/internal/set", json={"sdcpp": {"cpu_bin": "master-1-0000000"}}).status_code == 200
        wait_for(lambda: loaded(c).get(MODEL, {}).get("launch_command", [""])[0] != str(installed / "sd-server"))
        resp = c.post("/v1/load", json={"model_name": MODEL})
        assert resp.status_code >= 400 and "stable-diffusion.cpp master-1-0000000" in resp.text, resp.text

        own = tmp_path / "sd.cpp" / "build" / "bin"
        own.mkdir(parents=True)
        for exe in ("sd-server", "sd-cli"):
            shutil.copy2(sdcpp_backend / exe, own / exe)
        assert c.post("/internal/set", json={"sdcpp": {"cpu_bin": str(own)}}).status_code == 200
        assert c.post("/v1/load", json={"model_name": MODEL}).status_code == 200
        assert loaded(c)[MODEL]["launch_command"][0] == str(own / "sd-server")
    assert "sdcpp.cpu_bin=latest: the newest stable-diffusion.cpp release is " + NEWER in srv.log()


def test_cpu_bin_latest_offers_a_newer_release_as_an_update(make_server, hub_server, sd_releases, tmp_path):
    """The guide's upgrade signal: a release `latest` installed before keeps running when upstream
    publishes a newer one; the backend lists `update_available` with the install command, which
    applies it (the next load runs it)."""
    url, latest = sd_releases
    publish_sd(hub_server)
    env = sd_release_env(hub_server, url)
    cache = tmp_path / "cache"
    cache.mkdir()
    first = make_server(env=env, cache=cache, engines=(), config={"sdcpp": {"cpu_bin": "latest"}})
    with first.client(timeout=600) as c:
        pull_tiny_sd(c)
        assert c.post("/v1/install", json={"recipe": "sd-cpp", "backend": "cpu"}).status_code == 200
    first.stop()
    latest.write_text(json.dumps({"tag_name": NEWEST}))  # upstream publishes another release

    srv = make_server(env=env, cache=cache, engines=(), config={"sdcpp": {"cpu_bin": "latest"}})
    root = cache / "backends" / "sd-cpp"
    with srv.client(timeout=600) as c:
        cpu = c.get("/v1/system-info").json()["recipes"]["sd-cpp"]["backends"]["cpu"]
        assert cpu["state"] == "installed" and cpu["version"] == NEWER and cpu["update_available"] == NEWEST, cpu
        assert cpu["action"] == "lemonade backends install sd-cpp:cpu" and NEWEST in cpu["message"]
        listing = run_cli(srv, "backends")
        assert listing.returncode == 0 and "Update available" in listing.stdout, listing.stdout + listing.stderr
        assert c.post("/v1/load", json={"model_name": MODEL}).status_code == 200
        assert loaded(c)[MODEL]["launch_command"][0] == str(root / f"cpu@{NEWER}" / "sd-server")  # keeps running

        assert c.post("/v1/install", json={"recipe": "sd-cpp", "backend": "cpu"}).status_code == 200
        cpu = c.get("/v1/system-info").json()["recipes"]["sd-cpp"]["backends"]["cpu"]
        assert cpu["state"] == "installed" and cpu["version"] == NEWEST and "update_available" not in cpu, cpu
        c.post("/v1/unload", json={"model_name": MODEL})
        assert c.post("/v1/load", json={"model_name": MODEL}).status_code == 200
        assert loaded(c)[MODEL]["launch_command"][0] == str(root / f"cpu@{NEWEST}" / "sd-server")
