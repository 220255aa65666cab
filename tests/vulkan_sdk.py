"""The engines' `vulkan` backends in the test cache, built once (`.ci/run` runs this module before the
suite: `python -m tests.vulkan_sdk [RECIPE ...]`, llamacpp by default; tests/test_vulkan.py and
tests/test_vulkan_media.py call the same function), and Vulkan headers new enough for them.

The machine needs the Debian packages mesa-vulkan-drivers (lavapipe, the software Vulkan device),
libvulkan-dev, glslc, spirv-headers and vulkan-tools (`.ci/run` installs them). Where no GPU passes
the backend's device filter the install is forced (lavapipe is the CPU).

Debian 12's libvulkan-dev (1.3.239) lacks VK_EXT_layer_settings, which ggml-vulkan uses. The headers
are header-only files, so this takes Debian 13's libvulkan-dev package (1.4.309) from the Debian
archive with a private apt configuration (the machine's own sources and packages stay untouched),
unpacks its `usr/include` into the test cache and points `VULKAN_SDK` at it, the way the LunarG SDK
is used. The loader library stays the system's: the Vulkan loader works with newer headers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEBIAN_SUITE = "trixie"
PACKAGE = "libvulkan-dev"


def debian_vulkan_headers(cache: Path) -> Path:
    """A folder with `include/vulkan/vulkan.hpp` from Debian 13's libvulkan-dev (made once)."""
    from filelock import FileLock

    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / ".vulkan-sdk.lock")):  # .ci/run builds two backends at once
        done = sorted(cache.glob("vulkan-sdk-*/include/vulkan/vulkan.hpp"))
        if done:
            return done[-1].parents[2]
        return _download_headers(cache)


def _download_headers(cache: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="vulkan-headers-") as tmp:
        work = Path(tmp)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        (work / "sources.list").write_text(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                                           f"http://deb.debian.org/debian {DEBIAN_SUITE} main\n")
        opts = [f"-oDir::Etc::SourceList={work / 'sources.list'}", "-oDir::Etc::SourceParts=/nonexistent",
                f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
                "-oAPT::Sandbox::User=root"]
        subprocess.run(["apt-get", *opts, "update", "-qq"], check=True, timeout=600)
        subprocess.run(["apt-get", *opts, "download", PACKAGE], check=True, timeout=600, cwd=work)
        [deb] = work.glob(f"{PACKAGE}_*.deb")
        version = deb.name.split("_")[1].split("-")[0]
        subprocess.run(["dpkg", "-x", str(deb), str(work / "root")], check=True)
        target = cache / f"vulkan-sdk-{version}"
        partial = cache / f".vulkan-sdk-{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shutil.copytree(work / "root" / "usr" / "include", partial / "include")
        partial.rename(target)
        return target


def ensure_vulkan_backend(cache: Path, recipe: str = "llamacpp") -> Path:
    """The `vulkan` backend of `recipe` (llamacpp, whispercpp, sd-cpp) installed under `cache` (built
    from the pinned sources when the release archive is unreachable; nothing to do when it is
    installed already); its folder. Raises AssertionError naming what is missing when no Vulkan
    device or toolkit is here."""
    from lemonade.backends.llamacpp.gpu import backend_devices, missing_toolkit
    from lemonade.backends.registry import Engines
    from lemonade.config import Config
    from lemonade.system.devices import detect_devices

    report = detect_devices(refresh=True)
    assert report.vulkan, ("no Vulkan device here: apt-get install mesa-vulkan-drivers vulkan-tools (lavapipe, "
                           "Mesa's software Vulkan device; .ci/run installs them)")
    engine = Engines(cache, Config(cache, environ={})).get(recipe)
    assert engine is not None, recipe
    folder = cache / "backends" / recipe / "vulkan"
    if engine.state("vulkan").state == "installed":
        return folder
    sdk = os.environ.get("VULKAN_SDK")
    if not sdk and any("Vulkan headers" in m for m in missing_toolkit("vulkan")) and shutil.which("apt-get"):
        os.environ["VULKAN_SDK"] = str(debian_vulkan_headers(cache))  # Debian 12's are too old (above)
    try:
        missing = missing_toolkit("vulkan")
        assert not missing, f"the Vulkan source build needs: {'; '.join(missing)}"
        started = time.monotonic()
        # `force` only past the hardware filter (lavapipe is no GPU), not to the install: there it also
        # means "reinstall", and a test that waited on the install lock for .ci/run's background build of
        # this backend would then build it again instead of finding it installed
        engine.check_request("vulkan", force=not backend_devices("vulkan", report))
        engine.installer.install_pinned("vulkan", lambda e: print(e.get("message", ""), file=sys.stderr, flush=True))
        print(f"{recipe}:vulkan installed in {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        if sdk is None:
            os.environ.pop("VULKAN_SDK", None)
    return folder


if __name__ == "__main__":
    import signal

    from tests.helpers import TEST_CACHE

    # .ci/run stops a background build with SIGTERM: leave through the build's own clean-up, which stops
    # cmake and the compilers it started (native_build.run_logged)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    for name in sys.argv[1:] or ["llamacpp"]:
        print(f"{name}:vulkan is installed in {ensure_vulkan_backend(TEST_CACHE, name)}")
