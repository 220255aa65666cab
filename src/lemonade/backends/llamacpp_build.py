"""Producing a llama.cpp `llama-server`: the official release archive, or a build from source.

Both paths end in a folder that holds `llama-server` (plus, for a release archive, the shared
libraries next to it). `install.py` owns everything around that: the on-disk layout, locking,
`install.json`, and swapping a finished install into place. This module only knows how to get
binaries and how to report what it is doing.

The pinned engine is the llama.cpp that the `llama-cpp-python` sdist on PyPI vendors under
`vendor/llama.cpp`. The sdist carries no git metadata (its `.git` is a dangling submodule pointer),
so the release tag and commit are constants here. Upstream names release tags `b<build number>`
after the commit count; for 0.3.36 (CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098")
that is `b11312`. We pass both to CMake so a source build reports the same `--version` as the
release archive does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from lemonade.backends.engine import InstallError  # noqa: F401 - part of this module's API

log = logging.getLogger("lemonade.install")

# --- the pinned engine -------------------------------------------------------------------------

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER = 11312
LLAMA_CPP_VERSION = f"b{LLAMA_CPP_BUILD_NUMBER}"  # also the GitHub release tag

RELEASE_BASE_URL = "https://github.com/ggml-org/llama.cpp/releases/download"

# Environment overrides (documented in install.py's module docstring).
ENV_SDIST = "LEMONADE_LLAMACPP_SDIST"  # local sdist tarball instead of `pip download`
ENV_RELEASE_BASE_URL = "LEMONADE_LLAMACPP_RELEASE_BASE_URL"  # mirror of the GitHub release folder
ENV_NO_RELEASE = "LEMONADE_LLAMACPP_NO_RELEASE"  # "1": never try the release archive

RELEASE_CONNECT_TIMEOUT = 5.0  # seconds; an unreachable GitHub must fall back fast
RELEASE_READ_TIMEOUT = 60.0

# Targets we build and copy. llama-gguf-split is small and handy for tests (sharded models).
BUILD_TARGETS = ("llama-server", "llama-gguf-split")

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # One self-contained binary: a shared build hard-codes the build folder as RUNPATH.
    "-DBUILD_SHARED_LIBS=OFF",
    # Keep configure and build off the network.
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT[:9]}",
)



def cpu_cmake_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """Flags for this machine's CPU on top of llama.cpp's `-march=native`.

    AMX stays off: on CPUs that report AMX (Xeon Sapphire Rapids and later) the pinned build's AMX
    matrix kernels crashed llama-server with SIGSEGV in its warm-up decode (seen on this project's
    2-core VMs; `ggml_backend_amx_mul_mat`), while the AVX-512 kernels of the same build serve
    correctly. Explicit `-mno-amx-*` flags win over `-march=native` in GCC and Clang, so ggml
    compiles its AMX code out. A CPU without AMX builds exactly as before.
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    if "amx_tile" not in flags:
        return ()
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return (f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}")


def build_flags() -> list[str]:
    """Every CMake flag a source build of this machine uses; recorded in install.json, so a build
    made with other flags (an older Lemonade's) is rebuilt rather than trusted."""
    return [*CMAKE_FLAGS, *cpu_cmake_flags()]


TOOLCHAIN_HINT = (
    "Install a C/C++ toolchain and CMake, then retry. "
    "Debian/Ubuntu: `sudo apt-get install build-essential cmake`; "
    "Fedora: `sudo dnf install gcc-c++ make cmake`; macOS: `xcode-select --install && brew install cmake`."
)

Progress = Callable[[dict], None]


def emit(progress: Progress | None, phase: str, message: str, percent: float | None = None) -> None:
    """Send one progress event; a failing callback (e.g. a closed SSE stream) never stops an install."""
    if progress is None:
        return
    try:
        progress({"phase": phase, "message": message, "percent": percent})
    except Exception:  # the callback belongs to the caller
        log.debug("progress callback failed", exc_info=True)


# --- build log ---------------------------------------------------------------------------------


class BuildLog:
    """The full, human-readable record of one install attempt, kept next to the install."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # keep the previous attempt's log too (a retry often follows a failure)
            os.replace(path, path.with_name(path.name + ".1"))
        self._fh: IO[str] = open(path, "w", encoding="utf-8", errors="replace")

    def write(self, line: str) -> None:
        self._fh.write(line if line.endswith("\n") else line + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def tail(self, n: int = 40) -> str:
        self._fh.flush()
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=n)).rstrip("\n")


# --- toolchain ---------------------------------------------------------------------------------


def _which_env(var: str, candidates: Iterable[str]) -> str | None:
    """A compiler named in $CC/$CXX (first word, flags allowed), else the first candidate on PATH."""
    named = os.environ.get(var, "").split()
    if named:
        return shutil.which(named[0])
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    return None


def check_toolchain() -> dict[str, str]:
    """Fail fast, before any download, when the source build cannot possibly work."""
    found = {
        "cmake": shutil.which("cmake"),
        "c compiler": _which_env("CC", ("cc", "gcc", "clang")),
        "c++ compiler": _which_env("CXX", ("c++", "g++", "clang++")),
        "build tool (make or ninja)": shutil.which("make") or shutil.which("ninja"),
    }
    missing = [name for name, path in found.items() if not path]
    if missing:
        raise InstallError(
            f"Cannot build llama.cpp from source: {', '.join(missing)} not found on PATH. {TOOLCHAIN_HINT}",
            code="toolchain_missing",
        )
    out = subprocess.run([found["cmake"], "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if m and (int(m.group(1)), int(m.group(2))) < (3, 14):
        raise InstallError(
            f"Cannot build llama.cpp from source: CMake {m.group(1)}.{m.group(2)} is too old "
            f"(3.14 or newer needed). {TOOLCHAIN_HINT}",
            code="toolchain_missing",
        )
    tools = {k: v for k, v in found.items() if v}
    tools["generator"] = "" if shutil.which("make") else "Ninja"
    return tools


# --- version probe -----------------------------------------------------------------------------

# `--version` prints e.g. "version: 0.5.0-dev (build 11312, commit 0c1e57098)"; older builds
# printed "version: 11312 (0c1e5709)".
_VERSION_RES = (
    re.compile(r"\(build (\d+), commit ([0-9a-fA-F]+|unknown)\)"),
    re.compile(r"version:\s*(\d+)\s*\(([0-9a-fA-F]+|unknown)\)"),
)


def probe_version(binary: Path | str, timeout: float = 20.0) -> tuple[str | None, str]:
    """Run `<binary> --version`; return ("b<build>", or the commit when the build number is unknown,
    or None) and the raw output. Raises OSError / subprocess.TimeoutExpired when it cannot run."""
    proc = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    raw = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        return None, raw
    for pattern in _VERSION_RES:
        m = pattern.search(raw)
        if m:
            number = int(m.group(1))
            return (f"b{number}" if number > 0 else m.group(2)), raw
    return None, raw


# --- release archive ---------------------------------------------------------------------------


def release_asset_name(tag: str = LLAMA_CPP_VERSION) -> str | None:
    """The CPU release archive for this OS/CPU, or None where upstream publishes none."""
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if arch is None:
        return None
    if sys.platform.startswith("linux"):
        return f"llama-{tag}-bin-ubuntu-{arch}.tar.gz"
    if sys.platform == "darwin":
        return f"llama-{tag}-bin-macos-{arch}.tar.gz"
    if sys.platform == "win32":
        return f"llama-{tag}-bin-win-cpu-{arch}.zip"
    return None


def release_url(asset: str, tag: str = LLAMA_CPP_VERSION) -> str:
    base = os.environ.get(ENV_RELEASE_BASE_URL) or RELEASE_BASE_URL
    return f"{base.rstrip('/')}/{tag}/{asset}"


def _resolve_quickly(url: str, timeout: float) -> None:
    """Fail within `timeout` when the host name does not resolve (httpx's connect timeout does not
    cover DNS, and a machine without a resolver can hang there for much longer)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # the proxy resolves names, not us
    host = urlsplit(url).hostname
    if not host:
        return
    outcome: list[BaseException | None] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, 443)
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=resolve, name="lemonade-dns", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise TimeoutError(f"resolving {host} took longer than {timeout:.0f} s")
    if outcome[0] is not None:
        raise outcome[0]


def fetch_release(downloads_dir: Path, work_dir: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """Download + unpack the release archive into `work_dir`; return the folder holding llama-server.

    Raises any exception on failure (network, HTTP status, bad archive); the caller falls back to
    the source build.
    """
    import httpx  # a project dependency; imported here so the module loads fast

    asset = release_asset_name()
    if asset is None:
        raise RuntimeError(f"no llama.cpp release archive for {sys.platform}/{platform.machine()}")
    url = release_url(asset)
    downloads_dir.mkdir(parents=True, exist_ok=True)
    target = downloads_dir / asset
    blog.write(f"== release archive: {url}")
    if not target.is_file():
        emit(progress, "download", f"Downloading {asset}", 0.0)
        _resolve_quickly(url, RELEASE_CONNECT_TIMEOUT)
        part = target.with_name(target.name + ".part")
        timeout = httpx.Timeout(RELEASE_READ_TIMEOUT, connect=RELEASE_CONNECT_TIMEOUT)
        with httpx.stream("GET", url, follow_redirects=True, timeout=timeout) as resp:
            resp.raise_for_status()
            total = int(resp.headers.get("content-length") or 0)
            done = 0
            last = -1
            with open(part, "wb") as fh:
                for chunk in resp.iter_bytes(1 << 20):
                    fh.write(chunk)
                    done += len(chunk)
                    pct = int(done * 100 / total) if total else None
                    if pct is not None and pct != last:
                        last = pct
                        emit(progress, "download", f"Downloading {asset}", float(pct))
        os.replace(part, target)
        blog.write(f"downloaded {target} ({target.stat().st_size} bytes)")
    else:
        blog.write(f"using cached {target}")
    emit(progress, "install", f"Unpacking {asset}", None)
    unpack = work_dir / "release"
    unpack.mkdir(parents=True, exist_ok=True)
    try:
        _unpack_archive(target, unpack)
    except Exception:
        target.unlink(missing_ok=True)  # a corrupt cached archive must not stick
        raise
    exe = "llama-server.exe" if sys.platform == "win32" else "llama-server"
    hits = sorted(unpack.rglob(exe), key=lambda p: len(p.parts))
    if not hits:
        raise RuntimeError(f"{asset} holds no {exe}")
    return hits[0].parent


def _unpack_archive(archive: Path, dest: Path) -> None:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)  # zipfile refuses absolute paths and `..` on its own
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")


# --- sdist -------------------------------------------------------------------------------------


def sdist_filename() -> str:
    return f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"


PIP_HINT = (
    "Check network access to your package index (pip config), or download {name} yourself "
    "(`pip download --no-deps --no-binary :all: llama-cpp-python=={version}`) and set ${env} to its path."
)


def fetch_sdist(downloads_dir: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """The llama-cpp-python sdist: $LEMONADE_LLAMACPP_SDIST, a cached download, or `pip download`.

    Only pip options that every pip since 10 understands are used (`--progress-bar raw` exists only
    from pip 24.1, and the pip a fresh venv bundles may be older), so progress is measured here: pip
    downloads into its temp dir, which we point at a folder of ours and watch grow.
    """
    override = os.environ.get(ENV_SDIST)
    if override:
        path = Path(override).expanduser()
        blog.write(f"== sdist from ${ENV_SDIST}: {path}")
        if not path.is_file():
            raise InstallError(
                f"${ENV_SDIST} points to {path}, which is not a file. Point it at a "
                f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz, or unset it to download from PyPI.",
                code="sdist_invalid",
            )
        return path

    cached = downloads_dir / sdist_filename()
    if cached.is_file() and tarfile.is_tarfile(cached):
        blog.write(f"== using cached sdist {cached}")
        return cached

    hint = PIP_HINT.format(name=sdist_filename(), version=LLAMA_CPP_PYTHON_VERSION, env=ENV_SDIST)
    downloads_dir.mkdir(parents=True, exist_ok=True)
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        raise InstallError(
            f"Building llama.cpp needs the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sources, and this Python "
            f"({sys.executable}) has no pip to download them. Run `{sys.executable} -m ensurepip`, or: {hint}",
            code="download_failed",
        )
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--no-binary", ":all:", "--progress-bar", "off",
        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        "-d", str(downloads_dir),
    ]  # fmt: skip
    emit(progress, "download", f"Downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sources", None)
    pip_tmp = Path(tempfile.mkdtemp(prefix=".pip-tmp-", dir=downloads_dir))
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            size = _tree_size(pip_tmp)
            if size:
                emit(progress, "download",
                     f"pip is fetching llama-cpp-python sources ({size / 1e6:.0f} MB of work files so far)", None)

    watcher = threading.Thread(target=watch, name="sdist-progress", daemon=True)
    watcher.start()
    try:
        rc = run_logged(cmd, blog, env={"TMPDIR": str(pip_tmp)})
    finally:
        stop.set()
        watcher.join()
        shutil.rmtree(pip_tmp, ignore_errors=True)
    if rc != 0 or not cached.is_file():
        raise InstallError(
            f"Downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist with pip failed (exit {rc}). {hint}",
            code="download_failed",
        )
    return cached


def _tree_size(root: Path) -> int:
    """Bytes under `root`, tolerating files that another process removes meanwhile."""
    total = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name)).st_size
    return total


def extract_llama_cpp(sdist: Path, src_root: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """Unpack the sdist's `vendor/llama.cpp` into `<src_root>/llama.cpp-<version>/` (once).

    The folder appears only when complete (temp folder + rename), so a half-extracted tree is
    never mistaken for sources.
    """
    target = src_root / f"llama.cpp-{LLAMA_CPP_VERSION}"
    marker = target / ".lemonade-extracted"
    if marker.is_file():
        blog.write(f"== sources already extracted at {target}")
        return target

    emit(progress, "download", f"Extracting llama.cpp sources from {sdist.name}", None)
    blog.write(f"== extracting vendor/llama.cpp from {sdist}")
    src_root.mkdir(parents=True, exist_ok=True)
    bad = f"{sdist} is not a usable llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist"
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=src_root))
    try:
        try:
            tf = tarfile.open(sdist)
        except (tarfile.TarError, OSError) as exc:
            raise InstallError(f"{bad}: {exc}.", code="sdist_invalid") from exc
        found_version: str | None = None
        vendor_prefix: str | None = None
        with tf:
            for member in tf:
                parts = member.name.split("/")
                if len(parts) == 2 and parts[1] == "PKG-INFO" and member.isfile():
                    fh = tf.extractfile(member)
                    text = fh.read().decode("utf-8", "replace") if fh else ""
                    m = re.search(r"^Version:\s*(\S+)", text, re.M)
                    found_version = m.group(1) if m else None
                    continue
                if len(parts) >= 3 and parts[1] == "vendor" and parts[2] == "llama.cpp":
                    vendor_prefix = "/".join(parts[:3])
                    tf.extract(member, tmp, filter="data")
        if found_version is not None and found_version != LLAMA_CPP_PYTHON_VERSION:
            raise InstallError(
                f"{bad}: it is version {found_version}. Use the {LLAMA_CPP_PYTHON_VERSION} sdist.",
                code="sdist_invalid",
            )
        if vendor_prefix is None or not (tmp / vendor_prefix / "CMakeLists.txt").is_file():
            raise InstallError(
                f"{bad}: it contains no vendor/llama.cpp sources. Use the sdist from PyPI "
                f"(`pip download --no-deps --no-binary :all: llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}`).",
                code="sdist_invalid",
            )
        extracted = tmp / vendor_prefix
        for needed in ("tools/server", "convert_hf_to_gguf.py", "gguf-py"):
            if not (extracted / needed).exists():
                raise InstallError(f"{bad}: vendor/llama.cpp lacks {needed}.", code="sdist_invalid")
        (extracted / ".lemonade-extracted").write_text(
            f"{LLAMA_CPP_VERSION} {LLAMA_CPP_COMMIT} from {sdist.name}\n", encoding="utf-8"
        )
        if target.exists():  # an older, unmarked (incomplete) attempt
            shutil.rmtree(target)
        os.replace(extracted, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    blog.write(f"extracted to {target}")
    return target


# --- cmake -------------------------------------------------------------------------------------


def run_logged(
    cmd: list[str], blog: BuildLog, on_line: Callable[[str], None] | None = None, cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run a command, streaming stdout+stderr line by line into the log (and `on_line`)."""
    blog.write("$ " + " ".join(cmd))
    log.info("running %s", " ".join(cmd))
    env = dict(os.environ, LC_ALL="C", **(env or {}))  # stable, parseable tool output
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        text=True,
        errors="replace",
        bufsize=1,
    )
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            if on_line is not None:
                on_line(line)
            else:
                blog.write(line)
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: never leave a compiler running
            proc.kill()
            proc.wait()


_MAKE_PCT_RE = re.compile(r"^\[\s*(\d+)%\]")
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def cmake_build(src: Path, build_dir: Path, tools: dict[str, str], blog: BuildLog, progress: Progress | None) -> Path:
    """Configure + build the pinned targets; return the folder with the built binaries.

    `build_dir` is kept between attempts, so a retry after a failure (or after fixing a missing
    package) continues where the previous one stopped.
    """
    cmake = tools["cmake"]
    generator = tools.get("generator") or ""
    cache = build_dir / "CMakeCache.txt"
    if cache.is_file():
        text = cache.read_text(encoding="utf-8", errors="replace")
        home = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, re.M)
        gen = re.search(r"^CMAKE_GENERATOR:INTERNAL=(.*)$", text, re.M)
        stale = (home and Path(home.group(1)) != src) or (gen and generator and gen.group(1) != generator)
        if stale:
            blog.write(f"== build folder {build_dir} belongs to another source/generator; starting over")
            shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)

    emit(progress, "configure", "Configuring llama.cpp (cmake)", None)
    cmd = [cmake, "-S", str(src), "-B", str(build_dir), *build_flags()]
    if generator:
        cmd[1:1] = ["-G", generator]

    def on_configure(line: str) -> None:
        blog.write(line)
        if line.startswith("-- ") and not line.startswith("-- Performing Test"):
            emit(progress, "configure", line[3:], None)

    rc = run_logged(cmd, blog, on_configure)
    if rc != 0:
        raise InstallError(
            f"Configuring llama.cpp with CMake failed (exit {rc}).", code="build_failed", log_path=blog.path
        )

    jobs = _jobs()
    emit(progress, "build", f"Compiling llama.cpp with {jobs} job(s); this takes a while", 0.0)
    last = [-1.0]

    def on_build(line: str) -> None:
        blog.write(line)
        pct: float | None = None
        m = _MAKE_PCT_RE.match(line)
        if m:
            pct = float(m.group(1))
        else:
            n = _NINJA_RE.match(line)
            if n and int(n.group(2)):
                pct = round(int(n.group(1)) * 100.0 / int(n.group(2)), 1)
        # make restarts its percentage for each --target; only ever report forward progress
        if pct is not None and pct > last[0]:
            last[0] = pct
            message = re.sub(r"^\[[^\]]*\]\s*", "", line)
            emit(progress, "build", message, pct)

    cmd = [cmake, "--build", str(build_dir), "--target", *BUILD_TARGETS, "-j", str(jobs)]
    rc = run_logged(cmd, blog, on_build)
    if rc != 0:
        raise InstallError(f"Compiling llama.cpp failed (exit {rc}).", code="build_failed", log_path=blog.path)
    bin_dir = build_dir / "bin"
    if not (bin_dir / "llama-server").is_file():
        raise InstallError(
            f"The build finished but {bin_dir / 'llama-server'} is missing.",
            code="build_failed",
            log_path=blog.path,
        )
    return bin_dir
