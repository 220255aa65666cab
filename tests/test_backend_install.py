"""The llama.cpp installer: states, no-op reinstall, failures, uninstall, release-archive path.

None of these tests compiles llama.cpp. Tests that need a real build use the one installed in the
persistent test cache (`LEMONADE_TEST_CACHE`, default `~/.cache/lemonade-test`), made once with
`BackendInstaller(cache).install("llamacpp", "cpu")`; they are skipped when it is not there.
Everything that changes state works on a copy in a temp cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from lemonade.backends.llamacpp.gpu import backend_devices, best_backend
from lemonade.backends.llamacpp.install import (
    LLAMA_CPP_PYTHON_VERSION,
    PINNED_VERSION,
    BackendInstaller,
    InstallError,
)
from lemonade.backends.registry import Engines
from lemonade.config import Config
from lemonade.system.devices import detect_devices
from tests.helpers import served_folder

TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE") or Path.home() / ".cache" / "lemonade-test")
STATES = {"installed", "installable", "update_required", "unsupported"}


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch):
    for var in (
        "LEMONADE_LLAMACPP_SDIST",
        "LEMONADE_LLAMACPP_RELEASE_BASE_URL",
        "LEMONADE_LLAMACPP_NO_RELEASE",
        "LEMONADE_RELEASE_DIGESTS",
        "LEMONADE_GITHUB_API_URL",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def installed() -> BackendInstaller:
    inst = BackendInstaller(TEST_CACHE)
    if inst.llama_server_path("cpu") is None:
        pytest.skip(
            f"no llama.cpp cpu build in {TEST_CACHE}; run "
            "BackendInstaller(Path(cache)).install('llamacpp', 'cpu') once (about 10 minutes)"
        )
    return inst


def _copy_install(installed: BackendInstaller, cache: Path) -> BackendInstaller:
    """A temp cache holding a copy of the installed cpu backend."""
    inst = BackendInstaller(cache)
    shutil.copytree(installed.backend_dir("cpu"), inst.backend_dir("cpu"), symlinks=True)
    return inst


def _leftovers(inst: BackendInstaller) -> list[str]:
    if not inst.root.exists():
        return []
    return sorted(p.name for p in inst.root.iterdir() if p.name.startswith(".cpu."))


# --- state truthfulness ------------------------------------------------------------------------


def test_installed_state_matches_disk(installed: BackendInstaller):
    st = installed.state("llamacpp", "cpu")
    assert st.state == "installed"
    assert st.version == PINNED_VERSION
    assert st.message == "" and st.action == ""
    assert st.devices == ["cpu"]

    exe = installed.llama_server_path("cpu")
    assert exe == installed.backend_dir("cpu") / "llama-server"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert f"build {PINNED_VERSION[1:]}, commit 0c1e5709" in out.stdout + out.stderr

    info = json.loads((installed.backend_dir("cpu") / "install.json").read_text())
    assert info["version"] == PINNED_VERSION
    assert info["source"] in ("release", "source-build")
    assert info["llama_cpp_python"] == LLAMA_CPP_PYTHON_VERSION
    assert info["installed_at"]


def test_source_dir_has_converter(installed: BackendInstaller):
    src = installed.source_dir()
    assert src is not None, "source builds keep the llama.cpp sources (convert_hf_to_gguf.py)"
    assert (src / "convert_hf_to_gguf.py").is_file()
    assert (src / "gguf-py" / "gguf").is_dir()


def engines(cache: Path, tmp_path: Path) -> Engines:
    """Every recipe's engine description over `cache` (config from an empty temp dir)."""
    return Engines(cache, Config(tmp_path / "config"))


def test_recipes_info_shape(installed: BackendInstaller, tmp_path):
    info = engines(installed.cache_dir, tmp_path).system_info()
    llama = info["llamacpp"]
    report = detect_devices()
    assert llama["default_backend"] == (best_backend(report) or "cpu")
    assert set(llama["backends"]) == {"cpu", "system", "vulkan", "rocm", "cuda", "metal"}
    for name, b in llama["backends"].items():
        assert b["state"] in STATES, name
        assert isinstance(b["devices"], list) and isinstance(b["action"], str)
        # the spec: a message is required for every state but "installed", where it is empty
        assert (b["message"] == "") == (b["state"] == "installed"), name
    assert llama["backends"]["cpu"]["state"] == "installed"
    assert llama["backends"]["cpu"]["version"] == PINNED_VERSION
    for name in ("vulkan", "rocm", "cuda", "metal"):  # GPU backends: by this machine's devices (test_devices.py)
        devices = backend_devices(name, report)
        assert llama["backends"][name]["devices"] == devices
        if installed.llama_server_path(name) is not None:  # e.g. the forced vulkan build of test_vulkan.py
            assert llama["backends"][name]["state"] in ("installed", "update_required")
        else:
            assert llama["backends"][name]["state"] == ("installable" if devices else "unsupported")
    for recipe in ("sd-cpp", "whispercpp"):  # cpu: tests/test_images.py, tests/test_whispercpp.py
        vulkan = info[recipe]["backends"]["vulkan"]
        assert vulkan["devices"] == backend_devices("vulkan", report)
        if (installed.cache_dir / "backends" / recipe / "vulkan").exists():  # the build of test_vulkan_media.py
            assert vulkan["state"] in ("installed", "update_required"), vulkan
        else:
            assert vulkan["state"] == ("installable" if vulkan["devices"] else "unsupported"), vulkan
    for recipe in ("flm", "ryzenai-llm"):
        assert "default_backend" not in info[recipe], "all of its backends are unsupported"
        for b in info[recipe]["backends"].values():
            assert b["state"] == "unsupported"
            assert "not available in this build" in b["message"]


def test_empty_cache_is_installable(tmp_path):
    inst = BackendInstaller(tmp_path)
    st = inst.state("llamacpp", "cpu")
    assert st.state == "installable"
    assert st.action == "lemonade backends install llamacpp:cpu"
    assert st.message
    assert inst.llama_server_path("cpu") is None
    assert inst.source_dir() is None


def test_version_mismatch_is_update_required(installed, tmp_path):
    inst = _copy_install(installed, tmp_path)
    path = inst.backend_dir("cpu") / "install.json"
    info = json.loads(path.read_text())
    info["version"] = "b1"
    path.write_text(json.dumps(info))
    st = inst.state("llamacpp", "cpu")
    assert st.state == "update_required"
    assert st.version == "b1"
    assert "b1" in st.message and PINNED_VERSION in st.message
    assert st.action == "lemonade backends install llamacpp:cpu"


def test_system_backend_follows_path(installed, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    inst = BackendInstaller(tmp_path / "cache")
    st = inst.state("llamacpp", "system")
    assert st.state == "unsupported"
    assert st.message == "llama-server not found on PATH"
    assert st.action == "install llama.cpp and put llama-server on PATH"
    with pytest.raises(InstallError, match="llama-server not found on PATH") as err:
        inst.install("llamacpp", "system")
    assert err.value.code == "not_found"

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").symlink_to(installed.llama_server_path("cpu"))
    monkeypatch.setenv("PATH", str(bindir))
    st = inst.state("llamacpp", "system")
    assert st.state == "installed"
    assert st.version == PINNED_VERSION  # from `llama-server --version`
    assert inst.llama_server_path("system") == bindir / "llama-server"
    assert inst.install("llamacpp", "system")["status"] == "success"
    # a ready system llama-server is the default while cpu is not installed
    assert engines(inst.cache_dir, tmp_path).system_info()["llamacpp"]["default_backend"] == "system"


# --- install -----------------------------------------------------------------------------------


def test_reinstall_is_fast_noop(installed: BackendInstaller):
    exe = installed.llama_server_path("cpu")
    before = exe.stat().st_mtime_ns
    events: list[dict] = []
    started = time.monotonic()
    result = installed.install("llamacpp", "cpu", progress=events.append)
    elapsed = time.monotonic() - started
    assert result == {"status": "success", "recipe": "llamacpp", "backend": "cpu", "version": PINNED_VERSION}
    assert elapsed < 5, elapsed  # a sanity bound for "did not rebuild", not a benchmark
    assert exe.stat().st_mtime_ns == before
    assert events and events[-1]["phase"] == "done"
    assert set(events[-1]) == {"phase", "message", "percent"}


def test_broken_sdist_fails_with_log_tail(tmp_path, monkeypatch):
    # a tarball that looks like the sdist but carries no vendor/llama.cpp
    top = tmp_path / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    top.mkdir(parents=True)
    (top / "PKG-INFO").write_text(
        f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {LLAMA_CPP_PYTHON_VERSION}\n"
    )
    sdist = tmp_path / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    monkeypatch.setenv("LEMONADE_LLAMACPP_SDIST", str(sdist))

    inst = BackendInstaller(tmp_path / "cache")
    events: list[dict] = []
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu", progress=events.append)
    message = str(err.value)
    assert err.value.code == "sdist_invalid"
    assert "no vendor/llama.cpp sources" in message
    assert "--- last 40 lines of the log ---" in message
    assert f"Full log: {inst.log_path('cpu')}" in message
    assert inst.log_path("cpu").is_file()  # the log survives the failure
    assert "FAILED" in inst.log_path("cpu").read_text()
    # nothing that looks installed, nothing left behind
    assert inst.state("llamacpp", "cpu").state == "installable"
    assert not inst.backend_dir("cpu").exists()
    assert _leftovers(inst) == []


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_failing_cmake_reports_errors_and_keeps_build_dir(tmp_path, monkeypatch):
    """An sdist whose vendored llama.cpp fails to configure (a one-line CMakeLists, not a compile)."""
    top = tmp_path / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    vendor = top / "vendor" / "llama.cpp"
    (vendor / "tools" / "server").mkdir(parents=True)
    (vendor / "gguf-py").mkdir()
    (vendor / "convert_hf_to_gguf.py").write_text("")
    (vendor / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(broken NONE)\n"
        'message(FATAL_ERROR "deliberately broken for the test")\n'
    )
    sdist = tmp_path / "broken.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(top, arcname=top.name)
    monkeypatch.setenv("LEMONADE_LLAMACPP_SDIST", str(sdist))

    inst = BackendInstaller(tmp_path / "cache")
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu")
    message = str(err.value)
    assert err.value.code == "build_failed"
    assert message.startswith("Configuring llama.cpp with CMake failed")
    assert "run the install again" in message  # what to do next
    assert "deliberately broken for the test" in message  # the log tail
    assert "CMake Error" in message
    assert err.value.log_path == inst.log_path("cpu")
    assert inst.state("llamacpp", "cpu").state == "installable"
    assert inst.build_dir("cpu").is_dir(), "kept so that a retry is incremental"
    assert _leftovers(inst) == []


def test_missing_sdist_path_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("LEMONADE_LLAMACPP_SDIST", str(tmp_path / "nope.tar.gz"))
    inst = BackendInstaller(tmp_path / "cache")
    with pytest.raises(InstallError, match="LEMONADE_LLAMACPP_SDIST points to .*nope.tar.gz") as err:
        inst.install("llamacpp", "cpu")
    assert err.value.code == "sdist_invalid"
    assert not inst.backend_dir("cpu").exists()


def test_unreachable_release_and_no_toolchain(tmp_path, monkeypatch):
    """The release path falls back to a source build, which fails fast without cmake/compilers."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LEMONADE_LLAMACPP_RELEASE_BASE_URL", f"http://127.0.0.1:{port}")
    from lemonade.backends.llamacpp.build import release_asset_name

    pin(tmp_path, monkeypatch, {f"{PINNED_VERSION}/{release_asset_name()}": "0" * 64})  # pinned: it is tried
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    inst = BackendInstaller(tmp_path / "cache")
    started = time.monotonic()
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu")
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert err.value.code == "toolchain_missing"
    assert "Could not download the llama.cpp release archive" in message
    assert "cmake" in message and "apt-get install" in message
    assert inst.state("llamacpp", "cpu").state == "installable"


def test_unsupported_and_unknown_requests(tmp_path):
    inst = BackendInstaller(tmp_path)
    for recipe, backend, code in [
        ("llamacpp", "vulkan", "unsupported_backend"),
        ("llamacpp", "rocm", "unsupported_backend"),
        ("llamacpp", "metal", "unsupported_backend"),
        ("llamacpp", "cuda-99", "unknown_backend"),
        ("no-such-recipe", "cpu", "unknown_recipe"),
    ]:
        with pytest.raises(InstallError) as err:
            inst.install(recipe, backend)
        assert err.value.code == code, (recipe, backend)
        assert str(err.value)
    # a recipe whose engine this build does not ship refuses before any work
    ace = engines(tmp_path, tmp_path).get("acestep")
    assert ace is not None and not ace.available
    with pytest.raises(InstallError) as err:
        ace.install("default")
    assert err.value.code == "unsupported_backend" and "not available in this build" in str(err.value)


@pytest.fixture
def release_mirror(installed, tmp_path):
    """A local folder laid out like GitHub's release downloads, holding an archive packed the way
    llama.cpp's release workflow packs it (`llama-<tag>/` + binaries), built from our own binary.
    Yields (mirror URL, `<tag>/<asset>` key, the archive's SHA-256)."""
    from lemonade.backends.llamacpp.build import release_asset_name

    asset = release_asset_name()
    if asset is None or not asset.endswith(".tar.gz"):
        pytest.skip("no tar.gz release archive for this platform")
    root = tmp_path / "mirror"
    (root / PINNED_VERSION).mkdir(parents=True)
    with tarfile.open(root / PINNED_VERSION / asset, "w:gz") as tf:
        tf.add(installed.llama_server_path("cpu"), arcname=f"llama-{PINNED_VERSION}/llama-server")
    digest = hashlib.sha256((root / PINNED_VERSION / asset).read_bytes()).hexdigest()
    with served_folder(root) as url:
        yield url, f"{PINNED_VERSION}/{asset}", digest


def pin(tmp_path: Path, monkeypatch, pins: dict[str, str]) -> None:
    """Pins of our own for the mirror's archive (LEMONADE_RELEASE_DIGESTS): it is our build, not GitHub's."""
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(pins))
    monkeypatch.setenv("LEMONADE_RELEASE_DIGESTS", str(path))


def test_release_archive_path(release_mirror, tmp_path, monkeypatch):
    url, key, digest = release_mirror
    monkeypatch.setenv("LEMONADE_LLAMACPP_RELEASE_BASE_URL", url)
    pin(tmp_path, monkeypatch, {key: f"sha256:{digest}"})
    inst = BackendInstaller(tmp_path / "cache")
    events: list[dict] = []
    result = inst.install("llamacpp", "cpu", progress=events.append)
    assert result["version"] == PINNED_VERSION
    info = inst.read_install_info("cpu")
    assert info["source"] == "release"
    assert inst.state("llamacpp", "cpu").state == "installed"
    assert any(e["phase"] == "download" and e["percent"] == 100.0 for e in events)
    assert events[-1]["phase"] == "done"
    assert _leftovers(inst) == []
    assert f"sha256 {digest}: matches the pinned digest" in inst.log_path("cpu").read_text()


def test_release_archive_with_another_digest_installs_nothing(release_mirror, tmp_path, monkeypatch):
    """An archive that is not the pinned one is refused before it is unpacked: deleted, no backend, and
    no fallback build behind the user's back (the message says how to build from source)."""
    url, key, digest = release_mirror
    monkeypatch.setenv("LEMONADE_LLAMACPP_RELEASE_BASE_URL", url)
    wrong = "0" * 64
    pin(tmp_path, monkeypatch, {key: wrong})
    inst = BackendInstaller(tmp_path / "cache")
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu")
    assert err.value.code == "digest_mismatch"
    message = str(err.value)
    assert wrong in message and digest in message and "LEMONADE_LLAMACPP_NO_RELEASE=1" in message
    assert not inst.backend_dir("cpu").exists() and inst.llama_server_path("cpu") is None
    assert inst.state("llamacpp", "cpu").state == "installable"
    assert list(inst.downloads_dir.glob("llama-*")) == []  # the bad archive is not kept for a retry
    assert _leftovers(inst) == [] and not (inst.root / "_build").exists()  # nothing was compiled either


def publish(mirror_root: Path, key: str, digest: str) -> None:
    """What GitHub's release API answers for the tag (`/repos/<owner>/<repo>/releases/tags/<tag>`): each
    asset's name and `digest`. The mirror's web server stands in for api.github.com."""
    tag, asset = key.split("/", 1)
    folder = mirror_root / "repos" / "ggml-org" / "llama.cpp" / "releases" / "tags"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / tag).write_text(json.dumps({"tag_name": tag, "assets": [{"name": asset, "digest": f"sha256:{digest}"},
                                                                      {"name": "other.zip", "digest": None}]}))


def test_unpinned_release_archive_is_checked_against_githubs_digest(release_mirror, tmp_path, monkeypatch):
    """No pin: the digest GitHub publishes for the asset decides (the official archive, verified, for a
    user online); a different one is refused like a wrong pin."""
    url, key, digest = release_mirror
    monkeypatch.setenv("LEMONADE_LLAMACPP_RELEASE_BASE_URL", url)
    monkeypatch.setenv("LEMONADE_GITHUB_API_URL", url)
    mirror_root = tmp_path / "mirror"
    publish(mirror_root, key, "f" * 64)
    inst = BackendInstaller(tmp_path / "wrong")
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu")
    assert err.value.code == "digest_mismatch" and "GitHub publishes" in str(err.value)
    assert inst.llama_server_path("cpu") is None
    publish(mirror_root, key, digest)
    inst = BackendInstaller(tmp_path / "right")
    inst.install("llamacpp", "cpu")
    assert inst.read_install_info("cpu")["source"] == "release"
    assert f"sha256 {digest}: matches the published digest" in inst.log_path("cpu").read_text()


def test_unpinned_release_archive_is_not_downloaded(release_mirror, tmp_path, monkeypatch):
    """Neither a pin nor a published digest (GitHub states none for the tag here): no download, the
    install goes to the source build (here without a compiler, so it fails fast, saying why the
    archive was not used)."""
    url, _key, _digest = release_mirror
    monkeypatch.setenv("LEMONADE_LLAMACPP_RELEASE_BASE_URL", url)
    monkeypatch.setenv("LEMONADE_GITHUB_API_URL", url)  # answers 404 for the release: no digest stated
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    inst = BackendInstaller(tmp_path / "cache")
    with pytest.raises(InstallError) as err:
        inst.install("llamacpp", "cpu")
    assert err.value.code == "toolchain_missing" and "no SHA-256 digest is pinned" in str(err.value)
    assert not inst.downloads_dir.exists() or list(inst.downloads_dir.glob("llama-*")) == []
    assert inst.llama_server_path("cpu") is None


# --- uninstall ---------------------------------------------------------------------------------


def test_uninstall_copy(installed, tmp_path):
    inst = _copy_install(installed, tmp_path)
    assert inst.state("llamacpp", "cpu").state == "installed"
    assert inst.uninstall("llamacpp", "cpu") == {"status": "success", "recipe": "llamacpp", "backend": "cpu"}
    st = inst.state("llamacpp", "cpu")
    assert st.state == "installable"
    assert inst.llama_server_path("cpu") is None
    assert not inst.backend_dir("cpu").exists()
    assert _leftovers(inst) == []
    # the original is untouched, and a second uninstall is harmless
    assert installed.state("llamacpp", "cpu").state == "installed"
    assert inst.uninstall("llamacpp", "cpu")["status"] == "success"


def test_uninstall_system_is_refused(tmp_path):
    with pytest.raises(InstallError) as err:
        BackendInstaller(tmp_path).uninstall("llamacpp", "system")
    assert err.value.code == "unsupported_backend"


def test_source_build_leaves_amx_out_on_cpus_that_have_it(tmp_path):
    """AMX kernels of the pinned build crashed llama-server on AMX CPUs: they are compiled out there,
    and a CPU without AMX builds as before (flags read from the real /proc/cpuinfo format)."""
    from lemonade.backends.llamacpp.build import CMAKE_FLAGS, build_flags
    from lemonade.backends.native_build import cpu_cmake_flags

    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n\n")
    assert cpu_cmake_flags(plain) == () and cpu_cmake_flags(tmp_path / "missing") == ()
    flags = cpu_cmake_flags(amx)
    assert any(f.startswith("-DCMAKE_C_FLAGS=") and "-mno-amx-int8" in f for f in flags)
    assert any(f.startswith("-DCMAKE_CXX_FLAGS=") and "-mno-amx-tile" in f for f in flags)
    assert build_flags()[:len(CMAKE_FLAGS)] == list(CMAKE_FLAGS)


def test_a_build_made_with_other_flags_must_be_rebuilt(tmp_path):
    from lemonade.backends.llamacpp.build import LLAMA_CPP_PYTHON_VERSION, LLAMA_CPP_VERSION, build_flags
    from lemonade.backends.llamacpp.install import BackendInstaller
    from lemonade.util.atomic import atomic_write_json

    installer = BackendInstaller(tmp_path)
    folder = installer.backend_dir("cpu")
    folder.mkdir(parents=True)
    (folder / "llama-server").write_text("")
    info = {"version": LLAMA_CPP_VERSION, "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "source": "source-build"}
    atomic_write_json(folder / "install.json", info)
    assert installer.state("llamacpp", "cpu").state == "update_required"
    atomic_write_json(folder / "install.json", {**info, "cmake_flags": build_flags()})
    assert installer.state("llamacpp", "cpu").state == "installed"


def test_stopping_builds_ends_the_command_and_everything_it_started(tmp_path):
    """A server that stops mid-build (Services.aclose) leaves no compiler running: the build command
    runs in a process group of its own, which `stop_builds` kills whole."""
    import psutil

    from lemonade.backends.native_build import BuildLog, run_logged, stop_builds

    blog = BuildLog(tmp_path / "build.log")
    pids = tmp_path / "pids"
    # a "compiler" started in the background by the build command, as make starts cc1plus
    script = f"sleep 300 & echo $! > {pids}; echo started; wait"
    result: dict[str, int] = {}
    worker = threading.Thread(target=lambda: result.update(rc=run_logged(["sh", "-c", script], blog)))
    worker.start()
    deadline = time.monotonic() + 10
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pids.read_text())
    assert psutil.pid_exists(child)
    stop_builds()
    worker.join(10)
    assert not worker.is_alive() and result["rc"] != 0
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the build's child outlived stop_builds"
        time.sleep(0.05)
    assert "started" in (tmp_path / "build.log").read_text()
