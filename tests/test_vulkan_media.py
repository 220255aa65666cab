"""whisper.cpp and stable-diffusion.cpp on Vulkan for real: `whispercpp:vulkan` transcribes and
`sd-cpp:vulkan` draws, each on the machine's Vulkan device, as tests/test_vulkan.py proves it for
llama.cpp.

On a machine without a GPU, Mesa's software Vulkan driver (lavapipe, Debian `mesa-vulkan-drivers`) is
the device: both backends are installed with `force` (no GPU passes the hardware filter), built from
the pinned sources with `-DGGML_VULKAN=ON` (tests/vulkan_sdk.py; `.ci/run` builds them in the
background at the lowest priority, the CPU builds' ccache giving them everything but ggml's Vulkan
backend and its shaders), and the engines' own logs must say the model went to the Vulkan device. With
a real GPU the same tests run without `force` and the model's health `device` is "gpu".

The models are random-weight ones at real architectures (tests/ggml_whisper.py: Whisper tiny;
tests/sd_factory.py: SD 1.x with the tiny UNet): what they say and draw means nothing, so the tests
check the engine path, and compare the Vulkan device's numbers with the CPU backend's.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
import wave
import zipfile
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from lemonade.backends.llamacpp.gpu import backend_devices
from lemonade.backends.sdcpp.install import SDCPP_VERSION
from lemonade.backends.sdcpp.install import release_asset_name as sd_asset
from lemonade.backends.whispercpp.install import WHISPER_CPP_VERSION
from lemonade.backends.whispercpp.install import release_asset_name as whisper_asset
from lemonade.system.devices import detect_devices
from tests.ggml_whisper import FILE_NAME, tiny_random_whisper_ggml
from tests.helpers import TEST_CACHE, Server, engine_lines_since, loaded, served_folder
from tests.sd_factory import ESRGAN_FILE, SD_FILE, SD_REPO, publish_sd
from tests.speech import speak
from tests.vulkan_sdk import ensure_vulkan_backend

# `.ci/run` builds both backends in the background while the suite runs: the first test that needs them
# may wait for that build on its install lock (or, run alone on a machine without them, build them), which
# takes longer than the suite's 10 minutes per test on a busy machine.
pytestmark = pytest.mark.timeout(2400)

WHISPER = "Whisper-Tiny"  # catalog: ggerganov/whisper.cpp:ggml-tiny.bin, the random-weight model published below
WHISPER_REPO = "ggerganov/whisper.cpp"
SD = "user.Tiny-SD1"
ESRGAN = "RealESRGAN-x4plus"  # catalog: amd/realesrgan-x4plus:RealESRGAN_x4plus.pth, a random-weight RRDBNet here
SIZE = 64
RECIPES = ("whispercpp", "sd-cpp")
EXECUTABLES = {"whispercpp": ("whisper-server",), "sd-cpp": ("sd-server", "sd-cli")}


@pytest.fixture(scope="module")
def vulkan_backends(whispercpp_backend: Path, sdcpp_backend: Path) -> dict[str, Path]:
    """Both vulkan backends in the test cache (built once, after the cpu ones whose ccache they share)."""
    return {recipe: ensure_vulkan_backend(TEST_CACHE, recipe) for recipe in RECIPES}


def publish_models(hub) -> None:
    if not (hub.scratch / WHISPER_REPO / FILE_NAME).is_file():
        hub.create_repo(WHISPER_REPO, {FILE_NAME: tiny_random_whisper_ggml()})
    publish_sd(hub)


def link_vulkan(cache: Path, backends: dict[str, Path]) -> None:
    for recipe, folder in backends.items():
        link = cache / "backends" / recipe / "vulkan"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder, target_is_directory=True)


def pull_sd(c) -> None:
    resp = c.post("/v1/pull", json={"model_name": SD, "checkpoint": f"{SD_REPO}:{SD_FILE}", "recipe": "sd-cpp",
                                    "labels": ["image"]})
    assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def server(module_servers, hub_server, vulkan_backends, tmp_path_factory) -> Server:
    publish_models(hub_server)
    cache = tmp_path_factory.mktemp("vulkan-media-cache")
    link_vulkan(cache, vulkan_backends)
    # debug: the engines' own output goes to the server log too, where the device lines are read
    return module_servers(cache=cache, engines=("llamacpp", *RECIPES), args=["--log-level", "debug"],
                          env=hub_server.env())


@pytest.fixture(scope="module")
def sd_server(server) -> Server:
    """The server with the SD model registered and downloaded (1 GB through the local hub)."""
    with server.client(timeout=600) as c:
        pull_sd(c)
    return server


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    return speak("The quick brown fox jumps over the lazy dog.", tmp_path_factory.mktemp("speech") / "fox.wav")


def expected_device() -> str:
    return "gpu" if detect_devices().vulkan_gpus else "cpu"  # lavapipe is the CPU


def engine_log(server: Server) -> str:
    return server.log_path.read_text(errors="replace")


def load(c, model: str, **options) -> dict:
    c.post("/v1/unload", json={})
    resp = c.post("/v1/load", json={"model_name": model, **options})
    assert resp.status_code == 200, resp.text
    return loaded(c)[model.removeprefix("user.")]


# ----- what a user sees of the backends ----------------------------------------------------------------------

def test_system_info_lists_both_vulkan_backends_installed(server):
    report = detect_devices()
    with server.client() as c:
        recipes = c.get("/v1/system-info").json()["recipes"]
    for recipe in RECIPES:
        info = recipes[recipe]
        vulkan = info["backends"]["vulkan"]
        assert vulkan["state"] == "installed" and vulkan["message"] == "", vulkan
        assert vulkan["devices"] == backend_devices("vulkan", report)  # [] on lavapipe: no Vulkan GPU
        assert vulkan["version"] == (WHISPER_CPP_VERSION if recipe == "whispercpp" else SDCPP_VERSION)
        assert info["backends"]["cpu"]["state"] == "installed"
        # `auto` (the default of whispercpp.backend and sdcpp.backend): vulkan on a Vulkan GPU only
        assert info["default_backend"] == ("vulkan" if report.vulkan_gpus else "cpu")
    assert recipes["whispercpp"]["backends"]["npu"]["state"] == "unsupported"
    assert recipes["sd-cpp"]["backends"]["rocm"]["state"] == "unsupported"


# ----- whisper.cpp ----------------------------------------------------------------------------------------------

def transcribe(server: Server, wav: Path) -> openai.types.audio.TranscriptionVerbose:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    with open(wav, "rb") as fh:
        return client.audio.transcriptions.create(model=WHISPER, file=fh, response_format="verbose_json",
                                                  language="en")


def test_whisper_transcribes_on_the_vulkan_device(server, speech):
    report = detect_devices()
    with server.client(timeout=600) as c:
        model = load(c, WHISPER, whispercpp_backend="vulkan")
        assert model["recipe_options"]["whispercpp_backend"] == "vulkan"
        assert model["launch_command"][0].endswith("/backends/whispercpp/vulkan/whisper-server")
        assert model["device"] == expected_device()
        on_vulkan = transcribe(server, speech)
        with wave.open(str(speech)) as w:  # the audio's length, read from the file
            assert on_vulkan.duration == pytest.approx(w.getnframes() / w.getframerate(), abs=0.1)
        assert on_vulkan.segments

        # the default backend on this machine (`auto`): vulkan only on a Vulkan GPU
        model = load(c, WHISPER)
        assert model["recipe_options"]["whispercpp_backend"] == ("vulkan" if report.vulkan_gpus else "cpu")
    log = engine_log(server)
    # whisper.cpp's own lines: the device it chose and the model's weights in that device's memory. (What
    # it says is not compared with the CPU backend's: the random weights leave the decoder's choices to
    # near ties, which the order of floating-point sums decides differently on each device.)
    assert "whisper_backend_init_gpu: using Vulkan0 backend" in log, log[-4000:]
    assert re.search(r"whisper_model_load:\s+Vulkan0 total size =", log), log[-4000:]
    assert f"ggml_vulkan: 0 = {report.vulkan[0].name}" in log


# ----- stable-diffusion.cpp -----------------------------------------------------------------------------------

def draw(server: Server, seed: int) -> np.ndarray:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    picture = client.images.generate(model=SD, prompt="a lemon on a table", size=f"{SIZE}x{SIZE}", n=1,
                                     response_format="b64_json", extra_body={"steps": 2, "cfg_scale": 1.0,
                                                                             "seed": seed})
    image = Image.open(io.BytesIO(base64.b64decode(picture.data[0].b64_json)))
    assert image.format == "PNG" and image.size == (SIZE, SIZE)
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def test_sd_draws_on_the_vulkan_device(sd_server):
    server = sd_server
    with server.client(timeout=600) as c:
        model = load(c, SD, **{"sd-cpp_backend": "vulkan"})
        assert model["recipe_options"]["sd-cpp_backend"] == "vulkan"
        argv = model["launch_command"]
        assert argv[0].endswith("/backends/sd-cpp/vulkan/sd-server")
        assert "--vae-tiling" in argv and "--diffusion-fa" in argv  # upstream Lemonade's Vulkan defaults
        assert "-t" not in argv  # compute threads are the CPU backend's
        assert model["device"] == expected_device()
        on_vulkan = draw(server, seed=7)

        model = load(c, SD, **{"sd-cpp_backend": "cpu"})
        assert "--vae-tiling" not in model["launch_command"]
        on_cpu, other_seed = draw(server, seed=7), draw(server, seed=8)
    log = engine_log(server)
    # sd.cpp's own line: every part of the model in the device's memory ("VRAM"; the build's only device
    # besides the CPU is Vulkan's), where the CPU backend's says "RAM"
    assert re.search(r"total params memory size = [\d.]+MB \(VRAM [1-9][\d.]*MB, RAM 0\.00MB\)", log), log[-4000:]
    assert re.search(r"total params memory size = [\d.]+MB \(VRAM 0\.00MB, RAM [1-9][\d.]*MB\)", log)
    # The same seed on the CPU backend gives nearly the same picture (floating-point differences only),
    # far nearer than another seed does: the Vulkan device computed the same thing.
    same, other = np.abs(on_vulkan - on_cpu).mean(), np.abs(on_cpu - other_seed).mean()
    assert same < other / 4, (same, other)


def test_upscaling_runs_on_the_backend_sdcpp_backend_names(sd_server):
    """ESRGAN upscaling is `sd-cli` per request, of the backend `sdcpp.backend` names (as upstream's
    upscale takes the configured one): vulkan here, set live. (sd-cli names its device only in its
    debug output, and the random-weight upscaler draws black on every device, so the proof that the
    Vulkan build runs on the device is the sd-server test's.)"""
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 120, 40)).save(buf, format="PNG")
    source = base64.b64encode(buf.getvalue()).decode()
    server = sd_server
    with server.client(timeout=600) as c:
        seq, _ = engine_lines_since(server, 0, "")
        assert c.post("/internal/set", json={"sdcpp": {"backend": "vulkan"}}).status_code == 200
        try:
            resp = c.post("/v1/images/upscale", json={"model": ESRGAN, "image": source})
        finally:
            c.post("/internal/set", json={"sdcpp": {"backend": "auto"}})
    assert resp.status_code == 200, resp.text
    assert Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"]))).size == (128, 96)
    # the vulkan build's sd-cli ran (its sd-server's use of the device: test_sd_draws_on_the_vulkan_device)
    cli = Path(server.cache) / "backends" / "sd-cpp" / "vulkan" / "sd-cli"
    assert f"Upscaling with {ESRGAN_FILE} on the vulkan backend: {cli}" in engine_log(server)
    _, lines = engine_lines_since(server, seq, f"engine.sd-cli:{ESRGAN_FILE}")
    assert any("upscaling from (32 x 24) to (128 x 96)" in line for line in lines), lines[-40:]


def test_vulkan_args_apply_to_vulkan_loads_only(sd_server):
    """`whispercpp.vulkan_args` and `sdcpp.vulkan_args` (guide-configuration-README.md, "Backend
    Configuration") reach the engine when a model runs on the vulkan backend, and the cpu backend's own
    `cpu_args` when it runs there. Set live with /internal/set, as `lemonade config set` does."""
    settings = {"whispercpp": {"vulkan_args": "-bs 3", "cpu_args": "-bs 4"},
                "sdcpp": {"vulkan_args": "--mmap", "cpu_args": "--vae-conv-direct"}}
    with sd_server.client(timeout=600) as c:
        assert c.post("/internal/set", json=settings).status_code == 200
        try:
            for backend, beams in (("vulkan", "3"), ("cpu", "4")):
                argv = load(c, WHISPER, whispercpp_backend=backend)["launch_command"]
                assert argv[argv.index("-bs") + 1] == beams, argv
            argv = load(c, SD, **{"sd-cpp_backend": "vulkan"})["launch_command"]
            assert "--mmap" in argv and "--vae-conv-direct" not in argv, argv
            argv = load(c, SD, **{"sd-cpp_backend": "cpu"})["launch_command"]
            assert "--vae-conv-direct" in argv and "--mmap" not in argv, argv
        finally:
            c.post("/internal/set", json={s: dict.fromkeys(v, "") for s, v in settings.items()})
            c.post("/v1/unload", json={})


# ----- install, uninstall and your own build --------------------------------------------------------------------

def pack_release(recipe: str, build: Path, folder: Path) -> str:
    """An archive of our own vulkan build under the name the release folder has for it (upstream's
    zip for sd.cpp, Lemonade's build repository's tar.gz for whisper.cpp); its asset key for the pins."""
    if recipe == "whispercpp":
        tag, asset = WHISPER_CPP_VERSION, whisper_asset(WHISPER_CPP_VERSION, "vulkan")
        (folder / tag).mkdir(parents=True, exist_ok=True)
        with tarfile.open(folder / tag / asset, "w:gz") as tf:
            tf.add(build / "whisper-server", f"whisper-{tag}/whisper-server")
    else:
        tag, asset = SDCPP_VERSION, sd_asset(backend="vulkan")
        (folder / tag).mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(folder / tag / asset, "w") as zf:  # `zip -j`, as upstream's CI packs it
            for exe in EXECUTABLES[recipe]:
                zf.write(build / exe, exe)
    return f"{tag}/{asset}"


def test_install_with_force_uninstall_and_vulkan_bin(make_server, hub_server, vulkan_backends, tmp_path):
    """The states a user sees on the way: without a Vulkan GPU the backend is `unsupported` and an
    install is refused unless forced; a forced install takes the release archive (a local mirror of
    the release folders holding our own builds, pinned by digest); uninstall takes it away again; and
    `<section>.vulkan_bin` pointing at a build of one's own is used as it is."""
    if whisper_asset(WHISPER_CPP_VERSION, "vulkan") is None or sd_asset(backend="vulkan") is None:
        pytest.skip("no Vulkan release archive is published for this platform")
    gpu = bool(detect_devices().vulkan_gpus)
    mirror = tmp_path / "mirror"
    keys = [pack_release(recipe, vulkan_backends[recipe], mirror) for recipe in RECIPES]
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({key: hashlib.sha256((mirror / key).read_bytes()).hexdigest() for key in keys}))
    with served_folder(mirror) as url:
        # the mirror stands in for GitHub's release folders, whose digests are pinned here
        srv = make_server(engines=("llamacpp", *RECIPES), env={
            **hub_server.env(), "LEMONADE_RELEASE_DIGESTS": str(pins), "LEMONADE_WHISPERCPP_RELEASE_BASE_URL": url,
            "LEMONADE_SDCPP_RELEASE_BASE_URL": url})
        with srv.client(timeout=600) as c:
            for recipe in RECIPES:
                vulkan = c.get("/v1/system-info").json()["recipes"][recipe]["backends"]["vulkan"]
                if gpu:
                    assert vulkan["state"] == "installable", vulkan
                else:
                    assert vulkan["state"] == "unsupported" and "software renderer" in vulkan["message"], vulkan
                    refused = c.post("/v1/install", json={"recipe": recipe, "backend": "vulkan"})
                    assert refused.status_code == 400 and "--force" in refused.text, refused.text
                resp = c.post("/v1/install", json={"recipe": recipe, "backend": "vulkan", "force": True})
                assert resp.status_code == 200, resp.text
                folder = srv.cache / "backends" / recipe / "vulkan"
                assert json.loads((folder / "install.json").read_text())["source"] == "release"
                vulkan = c.get("/v1/system-info").json()["recipes"][recipe]["backends"]["vulkan"]
                assert vulkan["state"] == "installed", vulkan

                assert c.post("/v1/uninstall", json={"recipe": recipe, "backend": "vulkan"}).status_code == 200
                assert not folder.exists()
                vulkan = c.get("/v1/system-info").json()["recipes"][recipe]["backends"]["vulkan"]
                assert vulkan["state"] == ("installable" if gpu else "unsupported"), vulkan

            # your own build (here: the test cache's), as `whispercpp.vulkan_bin` and `sdcpp.vulkan_bin`
            own = {"whispercpp": {"vulkan_bin": str(vulkan_backends["whispercpp"])},
                   "sdcpp": {"vulkan_bin": str(vulkan_backends["sd-cpp"])}}
            assert c.post("/internal/set", json=own).status_code == 200, own
            recipes = c.get("/v1/system-info").json()["recipes"]
            for recipe in RECIPES:
                vulkan = recipes[recipe]["backends"]["vulkan"]
                assert vulkan["state"] == "installed" and "your own build" in vulkan["message"], vulkan
                refused = c.post("/v1/uninstall", json={"recipe": recipe, "backend": "vulkan"})
                assert refused.status_code >= 400 and "does not remove it" in refused.text, refused.text
            model = load(c, WHISPER, whispercpp_backend="vulkan")
            assert model["launch_command"][0] == str(vulkan_backends["whispercpp"] / "whisper-server")


def test_vulkan_builds_and_archives():
    """A vulkan source build is the cpu build plus ggml's Vulkan switch (recorded in install.json, so a
    build with other flags is rebuilt); the archives are those upstream Lemonade installs."""
    from lemonade.backends.sdcpp.install import SDCPP_COMMIT, SdCppInstall
    from lemonade.backends.whispercpp.install import WhisperCppInstall

    for installer in (WhisperCppInstall(TEST_CACHE), SdCppInstall(TEST_CACHE)):
        assert installer.build_flags("vulkan") == [*installer.build_flags("cpu"), "-DGGML_VULKAN=ON"]
    whisper = WhisperCppInstall(TEST_CACHE)
    asset = whisper.release_asset("vulkan")
    if asset is not None:  # x86-64 Linux or Windows
        assert whisper.release_url(asset, "vulkan") == ("https://github.com/lemonade-sdk/whisper.cpp-rocm/releases/"
                                                        f"download/{WHISPER_CPP_VERSION}/{asset}")
        assert asset in (f"whisper-{WHISPER_CPP_VERSION}-linux-vulkan-x86_64.tar.gz",
                         f"whisper-{WHISPER_CPP_VERSION}-windows-vulkan-x64.zip")
    asset = SdCppInstall(TEST_CACHE).release_asset("vulkan")
    if asset is not None:
        assert asset in (f"sd-master-{SDCPP_COMMIT[:7]}-bin-Linux-Ubuntu-24.04-x86_64-vulkan.zip",
                         f"sd-master-{SDCPP_COMMIT[:7]}-bin-win-vulkan-x64.zip")


def test_build_progress_skips_the_shader_generators_own_build():
    """ggml's Vulkan shader generator is a build nested in the build, counting to 100 % within the first
    tenth of it: its lines (as llama.cpp's vulkan build printed them) say nothing of the progress."""
    from lemonade.backends.native_build import build_percent

    assert build_percent("[ 11%] Built target llama-ui") == 11.0
    assert build_percent("[100%] Linking CXX executable vulkan-shaders-gen") is None
    assert build_percent("[100%] Built target vulkan-shaders-gen") is None
    assert build_percent("[ 11%] Generate vulkan shaders for acc.comp") == 11.0
    assert build_percent("[37/120] Building CXX object x.o") == 30.8
    assert build_percent("-- Configuring done") is None
