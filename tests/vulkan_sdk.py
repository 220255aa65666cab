"""Vulkan headers new enough for the pinned llama.cpp's Vulkan backend, for the opt-in Vulkan test.

Debian 12's libvulkan-dev (1.3.239) lacks VK_EXT_layer_settings, which ggml-vulkan uses. The headers
are header-only files, so the test takes Debian 13's libvulkan-dev package (1.4.309) from the Debian
archive with a private apt configuration (the machine's own sources and packages stay untouched),
unpacks its `usr/include` into the test cache and points `VULKAN_SDK` at it, the way the LunarG SDK
is used. The loader library stays the system's: the Vulkan loader works with newer headers.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

DEBIAN_SUITE = "trixie"
PACKAGE = "libvulkan-dev"


def debian_vulkan_headers(cache: Path) -> Path:
    """A folder with `include/vulkan/vulkan.hpp` from Debian 13's libvulkan-dev (made once)."""
    done = sorted(cache.glob("vulkan-sdk-*/include/vulkan/vulkan.hpp"))
    if done:
        return done[-1].parents[2]
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
