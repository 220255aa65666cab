"""Installing a native engine backend (a server binary) into the cache dir, atomically.

Shared by whisper.cpp (`backends/whispercpp/install.py`) and stable-diffusion.cpp
(`backends/sdcpp/install.py`). The layout under
`<cache>/backends/<recipe>/`:

    <backend>/               the installed backend (appears only when complete)
      <server binary>        a static build, or a release archive's binary + libs
      install.json           {"version", "source": "release"|"source-build", ...}
    <backend>-build.log      full log of the last install attempt (kept after failures)
    _downloads/              sdist / release archive, reused by retries
    _src/<project>-<ver>/    extracted sources
    _build/<backend>-<ver>/  CMake build folder, kept so a retried build is incremental
    .install.lock            serialises installs across threads and processes

An install is produced in a temp sibling folder (`.<backend>.tmp-*`), checked, and renamed into
place at the end, so a failed or interrupted install never leaves something that looks installed.
A subclass says how the binaries are produced (`_produce`) and checked (`_verify`).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.engine import InstallError
from lemonade.backends.llamacpp.gpu import GPU_BACKENDS, missing_toolkit
from lemonade.backends.llamacpp.gpu import cmake_flags as gpu_cmake_flags
from lemonade.backends.native_build import (
    BuildLog,
    Progress,
    VendoredSource,
    check_toolchain,
    cmake_build,
    cpu_cmake_flags,
    emit,
    extract_vendored,
    fetch_release,
    fetch_sdist,
)
from lemonade.paths import backends_dir
from lemonade.util.atomic import atomic_write_json, read_json

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger("lemonade.install")

INSTALL_JSON = "install.json"


class NativeInstall:
    """The installs of one recipe's native backends under one cache dir.

    `install_pinned()` blocks (the server runs it in a worker thread) and is safe to call
    concurrently from threads or processes: a second caller waits for the first and then finds
    it installed.
    """

    recipe: str = ""
    version: str = ""  # the pinned engine version an install must report
    executables: tuple[str, ...] = ()  # what a complete install holds (the server first)
    cmake_flags: tuple[str, ...] = ()  # the project's own CMake flags for a source build
    source: VendoredSource | None = None  # the pinned sources a source build uses
    build_targets: tuple[str, ...] = ()  # the CMake targets that produce `executables`
    env_no_release: str = ""  # environment variable that skips the release archive
    config_section: str = ""  # the config section of the engine's settings ("whispercpp", "sdcpp")
    upstream_repo: str = ""  # owner/name on GitHub, whose newest release `<section>.<backend>_bin=latest` is
    env_release_base_url: str = ""  # environment variable naming a mirror of the release folder(s)

    def __init__(self, cache_dir: Path, tag: str | None = None) -> None:
        """`tag`: another upstream release than the pinned one (`<recipe>.<backend>_bin`, native_bins.py),
        installed from its release archive only (the sources Lemonade builds are the pinned ones) into
        `<backend>@<tag>/`, beside the pinned install, so switching back costs nothing."""
        self.cache_dir = Path(cache_dir)
        self.root = backends_dir(self.cache_dir) / self.recipe
        self.tag = tag
        if tag is not None:
            self.version = tag

    # --- paths ---------------------------------------------------------------------------------

    def backend_dir(self, backend: str) -> Path:
        return self.root / (f"{backend}@{self.tag}" if self.tag else backend)

    def log_path(self, backend: str) -> Path:
        return self.root / (f"{backend}@{self.tag}-install.log" if self.tag else f"{backend}-build.log")

    @property
    def downloads_dir(self) -> Path:
        return self.root / "_downloads"

    @property
    def src_root(self) -> Path:
        return self.root / "_src"

    def build_dir(self, backend: str) -> Path:
        if self.tag:  # never made (release archives only), and never the pinned build's, whatever the tag
            return self.root / "_build" / f"{backend}@{self.tag}"
        return self.root / "_build" / f"{backend}-{self.version}"

    def _lock(self) -> FileLock:
        from filelock import FileLock  # installs only: not imported by a server start

        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".install.lock"))

    def read_install_info(self, backend: str) -> dict | None:
        """install.json of an installed backend, None when absent or unreadable."""
        try:
            info = read_json(self.backend_dir(backend) / INSTALL_JSON, None)
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def build_flags(self, backend: str = "cpu") -> list[str]:
        """Every CMake flag a source build of `backend` on this machine uses (recorded in install.json). A
        GPU backend adds ggml's switch for it, the one llama.cpp's build uses (llamacpp.gpu.cmake_flags):
        the three engines build the same ggml backends."""
        gpu = gpu_cmake_flags(backend) if backend in GPU_BACKENDS else ()
        return [*self.cmake_flags, *cpu_cmake_flags(), *gpu]

    def binary(self, name: str, backend: str = "cpu") -> Path | None:
        """One of `executables` of an installed backend, else None."""
        exe = self.backend_dir(backend) / name
        if exe.is_file() and os.access(exe, os.X_OK) and (self.backend_dir(backend) / INSTALL_JSON).is_file():
            return exe
        return None

    def installed_version(self, backend: str = "cpu") -> str | None:
        """The version install.json records, when every executable is there too."""
        if any(self.binary(name, backend) is None for name in self.executables):
            return None
        info = self.read_install_info(backend)
        return info.get("version") if info else None

    def built_with_other_flags(self, backend: str = "cpu") -> bool:
        """A source build made with other CMake flags than this machine's now (e.g. with AMX kernels,
        which crash on some CPUs): it must be rebuilt, not trusted."""
        info = self.read_install_info(backend) or {}
        return info.get("source") == "source-build" and info.get("cmake_flags") != self.build_flags(backend)

    def is_installed(self, backend: str) -> bool:
        """Installed and up to date (the pinned version, built for this machine)."""
        return self.installed_version(backend) == self.version and not self.built_with_other_flags(backend)

    # --- what a subclass says ------------------------------------------------------------------

    def release_asset(self, backend: str = "cpu") -> str | None:
        """The release archive of `backend` published for this machine at `version`, None where there is none."""
        return None

    def version_fields(self) -> dict[str, Any]:
        """What install.json records of the version: the pin's commit and source package too, for the
        pinned install."""
        return {"version": self.version}

    def release_folder(self, backend: str = "cpu") -> str:
        """The official release folder of `backend`'s archives (`https://github.com/<owner>/<repo>/releases/
        download`), whose stated digests check an archive that has no pin (release_digests.py)."""
        raise NotImplementedError

    def release_url(self, asset: str, backend: str = "cpu") -> str:
        """Where `asset` of `version` is downloaded from: the official folder, or the mirror in
        `$<env_release_base_url>` (laid out the same: `<tag>/<asset>`)."""
        base = os.environ.get(self.env_release_base_url) or self.release_folder(backend)
        return f"{base.rstrip('/')}/{self.version}/{asset}"

    def _heading(self, backend: str) -> str:
        """The build log's first line: what is installed, from which sources."""
        return f"Lemonade install of {self.recipe}:{backend} {self.version}"

    def _produce(self, backend: str, staging: Path, work: Path, blog: BuildLog, progress: Progress | None) -> dict:
        """Fill `staging` with the binaries: the release archive where allowed and reachable, else a
        source build of `source`; return the install.json fields known so far."""
        assert self.source is not None
        project = self.source.project
        release_error: str | None = None
        asset = self.release_asset(backend)
        if self.tag is not None:
            return self._produce_tagged(backend, asset, staging, work, blog, progress)
        if asset is not None and release_allowed(self.source.env_sdist, self.env_no_release, asset):
            try:
                folder = fetch_release(self.release_url(asset, backend), self.executables[0], self.downloads_dir, work,
                                       blog, progress, no_release_env=self.env_no_release,
                                       publisher=self.release_folder(backend))
                self._copy_release(folder, staging)
                blog.write(f"== release archive unpacked from {folder}")
                return {"source": "release"}
            except InstallError:
                raise
            except Exception as exc:  # any failure here means: build from source
                release_error = f"{type(exc).__name__}: {exc}"
                blog.write(f"== release archive unavailable ({release_error}); building from source")
                emit(progress, "download", f"Release archive unavailable; building {project} from source", None)
        try:
            tools = check_toolchain(project)
            missing = missing_toolkit(backend) if backend in GPU_BACKENDS else []
            if missing:
                raise InstallError(f"Cannot build the {project} {backend} backend from source: {'; '.join(missing)} "
                                   "not found. Install it and try again.", code="toolchain_missing")
        except InstallError as exc:
            if release_error:
                raise InstallError(f"Could not download the {project} release archive ({release_error}), and {exc}",
                                   code=exc.code) from exc
            raise
        blog.write("== toolchain: " + ", ".join(f"{k}={v}" for k, v in tools.items() if v))
        sdist = fetch_sdist(self.source, self.downloads_dir, blog, progress)
        src = extract_vendored(self.source, sdist, self.src_root, blog, progress)
        flags = self.build_flags(backend)
        bin_dir = cmake_build(project, src, self.build_dir(backend), tools, blog, progress, flags=flags,
                              targets=self.build_targets, binary=self.executables[0])
        emit(progress, "install", f"Copying {' and '.join(self.executables)} into {self.backend_dir(backend)}", None)
        for exe in self.executables:
            shutil.copy2(bin_dir / exe, staging / exe)
        return {"source": "source-build", "build_dir": str(self.build_dir(backend)), "cmake_flags": flags}

    def _produce_tagged(self, backend: str, asset: str | None, staging: Path, work: Path, blog: BuildLog,
                        progress: Progress | None) -> dict:
        """Another release than the pinned one: its official archive, or a clear refusal."""
        assert self.source is not None
        project, key = self.source.project, self.bin_key(backend)
        if asset is None:
            raise InstallError(self.no_archive_message(backend), code="unsupported_backend")
        try:
            folder = fetch_release(self.release_url(asset, backend), self.executables[0], self.downloads_dir, work,
                                   blog, progress, no_release_env=self.env_no_release,
                                   publisher=self.release_folder(backend))
        except InstallError:
            raise
        except Exception as exc:
            raise InstallError(f"Could not download {project} {self.tag} ({asset}): {type(exc).__name__}: {exc}. "
                               f"Check the tag, or use the version Lemonade ships: lemonade config set {key}=builtin",
                               code="download_failed") from exc
        self._copy_release(folder, staging)
        blog.write(f"== release archive {asset} unpacked from {folder}")
        return {"source": "release", "asset": asset}

    def no_archive_message(self, backend: str = "cpu") -> str:
        """Why another release than the pinned one cannot be installed here, and the two other ways."""
        assert self.source is not None
        key = self.bin_key(backend)
        kind = f" {backend}" if backend != "cpu" else ""
        return (f"{self.source.project} publishes no{kind} release archive of {self.tag} for this platform, and "
                f"Lemonade builds from source only the version it ships. Point {key} at a folder with your own build, "
                f"or use the shipped version: lemonade config set {key}=builtin")

    def _copy_release(self, folder: Path, staging: Path) -> None:
        copy_tree_contents(folder, staging)
        for exe in self.executables:  # a zip archive keeps no Unix modes
            if (staging / exe).is_file():
                (staging / exe).chmod(0o755)

    def bin_key(self, backend: str) -> str:
        """The setting that selects which build `backend` runs."""
        return f"{self.config_section}.{backend}_bin"

    def _verify(self, backend: str, staging: Path, blog: BuildLog, progress: Progress | None) -> dict[str, Any]:
        """Run the new binaries; return install.json fields (at least "version": `version_fields()` where
        the binary cannot tell), or raise InstallError(code="verify_failed")."""
        raise NotImplementedError

    # --- install / uninstall -------------------------------------------------------------------

    def install_pinned(self, backend: str, progress: Progress | None = None, force: bool = False) -> dict:
        """Install (or update) `backend` to the pinned version; blocking. `force=True` reinstalls an
        up-to-date one. Returns {"status": "success", "recipe", "backend", "version"}."""
        result = {"status": "success", "recipe": self.recipe, "backend": backend}
        name = f"{self.recipe}:{backend}"
        if self.is_installed(backend) and not force:
            emit(progress, "done", f"{name} {self.version} is already installed", 100.0)
            return {**result, "version": self.version}
        with self._lock():
            # Someone else may have finished the same install while we waited for the lock.
            if self.is_installed(backend) and not force:
                emit(progress, "done", f"{name} {self.version} is already installed", 100.0)
                return {**result, "version": self.version}
            self._sweep_leftovers(backend)
            started = time.monotonic()
            info = self._install_locked(backend, progress)
            log.info("installed %s %s (%s) in %.0f s", name, info["version"], info["source"],
                     time.monotonic() - started)
        emit(progress, "done", f"Installed {name} {info['version']}", 100.0)
        return {**result, "version": info["version"]}

    def _install_locked(self, backend: str, progress: Progress | None) -> dict:
        final = self.backend_dir(backend)
        staging = Path(tempfile.mkdtemp(prefix=f".{backend}.tmp-", dir=self.root))
        work = Path(tempfile.mkdtemp(prefix=f".{backend}.work-", dir=self.root))
        blog = BuildLog(self.log_path(backend))
        blog.write(f"{self._heading(backend)} at {_now()} on {platform.platform()}")
        log.info("installing %s:%s %s; log: %s", self.recipe, backend, self.version, blog.path)
        try:
            info = self._produce(backend, staging, work, blog, progress)
            info.update(self._verify(backend, staging, blog, progress))
            info.update({"recipe": self.recipe, "backend": backend, "installed_at": _now(), "log": str(blog.path)})
            atomic_write_json(staging / INSTALL_JSON, info)
            (staging / INSTALL_JSON).chmod(0o644)  # temp files are created 0600
            staging.chmod(0o755)  # mkdtemp makes 0700; the install should be readable like any program
            self._swap_into_place(staging, final)
            blog.write(f"== installed into {final}")
            return info
        except InstallError as exc:
            blog.write(f"== FAILED: {exc}")
            raise InstallError(with_tail(str(exc), blog), code=exc.code, log_path=blog.path) from exc
        except BaseException as exc:
            blog.write(f"== FAILED: {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt / SystemExit: clean up below, don't wrap
            raise InstallError(
                with_tail(f"Installing {self.recipe}:{backend} failed: {type(exc).__name__}: {exc}", blog),
                log_path=blog.path,
            ) from exc
        finally:
            blog.close()
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)

    def _swap_into_place(self, staging: Path, final: Path) -> None:
        """Replace `final` with `staging`; the old install disappears only after the new one is in."""
        old: Path | None = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=self.root))
            os.replace(final, old / final.name)
        os.replace(staging, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _sweep_leftovers(self, backend: str) -> None:
        """Temp folders from an install that crashed or was killed (we hold the lock)."""
        for pattern in (f".{backend}.tmp-*", f".{backend}.work-*", f".{backend}.old-*"):
            for path in self.root.glob(pattern):
                shutil.rmtree(path, ignore_errors=True)

    def remove(self, backend: str) -> dict:
        """Remove an installed backend (binaries, build folder, logs). The shared `_downloads/` and
        `_src/` stay, so a reinstall works offline. Removing what is not installed succeeds."""
        result = {"status": "success", "recipe": self.recipe, "backend": backend}
        with self._lock():
            final = self.backend_dir(backend)
            was_installed = final.exists()
            if was_installed:
                trash = Path(tempfile.mkdtemp(prefix=f".{backend}.old-", dir=self.root))
                os.replace(final, trash / final.name)  # atomic: gone from the layout at once
                shutil.rmtree(trash, ignore_errors=True)
            shutil.rmtree(self.build_dir(backend), ignore_errors=True)
            self.log_path(backend).unlink(missing_ok=True)
            self.log_path(backend).with_name(self.log_path(backend).name + ".1").unlink(missing_ok=True)
            self._sweep_leftovers(backend)
        log.info("uninstalled %s:%s (was installed: %s)", self.recipe, backend, was_installed)
        if not was_installed:
            result["message"] = f"{self.recipe}:{backend} was not installed"
        return result


# --- helpers -----------------------------------------------------------------------------------

_HINTS = (
    (
        ("No CMAKE_CXX_COMPILER could be found", "No CMAKE_C_COMPILER could be found",
         "is not able to compile a simple test program"),
        "The C/C++ compiler is missing or broken. Debian/Ubuntu: sudo apt-get install build-essential cmake",
    ),
    (
        ("Killed signal terminated program", "virtual memory exhausted", "out of memory"),
        "The compiler ran out of memory. Close other programs (or add swap) and run the install again.",
    ),
    (
        ("No space left on device",),
        "The disk is full. Free some space under the cache dir and run the install again.",
    ),
)  # fmt: skip


_ERROR_RE = re.compile(r"(\berror:|CMake Error|\*\*\* .*Error \d)")


def with_tail(message: str, blog: BuildLog, lines: int = 40) -> str:
    """The error message, a next step, the last lines of the build log and where the full log is."""
    try:
        tail = blog.tail(lines)
        with open(blog.path, encoding="utf-8", errors="replace") as fh:
            whole = fh.read()
    except OSError:
        tail = whole = ""
    hint = next((h for needles, h in _HINTS if any(n in whole for n in needles)), "")
    if not hint and "failed (exit" in message and ("CMake" in message or "Compiling" in message):
        hint = "Fix the problem shown below and run the install again; the build resumes where it stopped."
    out = message + (f"\n{hint}" if hint else "") + f"\nFull log: {blog.path}"
    # With parallel jobs and noisy compiler warnings the first error is often not in the tail.
    errors = [ln for ln in whole.splitlines() if _ERROR_RE.search(ln) and ln not in tail][:10]
    if errors:
        out += "\n--- first errors in the log ---\n" + "\n".join(errors)
    if tail:
        out += f"\n--- last {lines} lines of the log ---\n{tail}"
    return out


def copy_tree_contents(src: Path, dest: Path, only: str | None = None) -> None:
    """Copy `src`'s entries (or just the one named `only`) into `dest`, symlinks as symlinks."""
    for item in src.iterdir():
        if only is not None and item.name != only:
            continue
        target = dest / item.name
        if item.is_dir() and not item.is_symlink():
            shutil.copytree(item, target, symlinks=True)
        else:
            shutil.copy2(item, target, follow_symlinks=False)


def release_allowed(env_sdist: str, env_no_release: str, asset: str | None) -> bool:
    """Whether to try a release archive: there is one for this platform, and the user asked
    neither for a build from a given sdist nor for no release downloads."""
    if os.environ.get(env_sdist):
        return False
    if os.environ.get(env_no_release, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    return asset is not None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
