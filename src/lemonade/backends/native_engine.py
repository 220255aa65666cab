"""Backend state, install and uninstall of an engine whose backends are pinned native sources built
with ggml (whisper.cpp, stable-diffusion.cpp): `cpu`, and `vulkan` on any Vulkan GPU, each a release
archive where one is published, else a source build, installed by a `NativeInstall`.

Why a mixin: whisper.cpp and stable-diffusion.cpp answer these questions the same way, word for word
but for the product's name and build time; each engine keeps only what differs (`product`,
`build_minutes`, `unsupported_message` for the backends it lists but this build does not install).

The Vulkan backend follows llama.cpp's (backends/llamacpp/gpu.py, the same ggml): usable where a Vulkan GPU
is (`auto`, the default backend, picks it there), `unsupported` elsewhere until installed with
`force`; on a machine whose only Vulkan device is a software renderer (Mesa's lavapipe) it runs
there, named in `GGML_VK_VISIBLE_DEVICES` because ggml skips such devices otherwise, and the model's
device is the CPU.
"""

from __future__ import annotations

import logging
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lemonade.backends.bin_select import BinChoice, LatestTag, Unresolved, latest_release_tag
from lemonade.backends.engine import BackendState, InstallError, Progress, install_action
from lemonade.backends.llamacpp.gpu import backend_devices, unsupported_message, uses_gpu, vulkan_visible_devices
from lemonade.backends.native_bins import OwnNativeBuild
from lemonade.backends.native_install import NativeInstall
from lemonade.system.devices import detect_devices

if TYPE_CHECKING:
    from lemonade.config import Config

log = logging.getLogger("lemonade.install")

INSTALLED_BACKENDS = ("cpu", "vulkan")  # what this build installs; the others an engine lists are refused


class NativeBackends:
    """Mixed into an `Engine` (before it): `state`, `install`, `uninstall` and the default backend for
    `cpu` and `vulkan`, and how their processes start (`engine_env`, `device`)."""

    recipe: ClassVar[str]
    backends: ClassVar[tuple[str, ...]]
    backend_option: ClassVar[str | None]  # the Engine's
    installer: NativeInstall  # the pinned version ("builtin")
    config: Config  # the Engine's
    cache_dir: Path  # the Engine's
    product = ""  # the upstream project's name, e.g. "whisper.cpp"
    build_minutes = ""  # a source build's time on 2 cores, e.g. "3 to 8"

    def unsupported_message(self, backend: str) -> str:
        """Why `backend` (neither cpu nor vulkan) cannot be used with this build, and what to use instead."""
        raise NotImplementedError

    # ----- which build `<section>.<backend>_bin` selects (native_bins.py) -----------------------------
    def installer_for(self, backend: str, installing: bool = False) -> NativeInstall | OwnNativeBuild | Unresolved:
        """The pinned install, another release's, or the user's own build: what `<section>.<backend>_bin`
        selects to run, or with `installing`, what an install applies (`latest`'s newer release). The
        backends this build does not install are always the pinned installer's to refuse."""
        if backend not in INSTALLED_BACKENDS:
            return self.installer
        return self._bins.select(self.installer.bin_key(backend), self.installer, backend, installing)

    @cached_property
    def _bins(self) -> BinChoice:
        return BinChoice(self.config, LatestTag(self.product, self._resolve_latest), self.installer.root,
                         lambda folder, key: OwnNativeBuild(folder, key, self.installer.executables),
                         lambda tag: type(self.installer)(self.cache_dir, tag=tag))

    def _resolve_latest(self) -> str:
        from lemonade.backends.release_digests import api_url

        return latest_release_tag(f"{api_url().rstrip('/')}/repos/{self.installer.upstream_repo}/releases/latest")

    # ----- state -------------------------------------------------------------------------------------
    def state(self, backend: str) -> BackendState:
        if backend not in INSTALLED_BACKENDS:
            return BackendState(self.recipe, backend, "unsupported", message=self.unsupported_message(backend))
        chosen = self.installer_for(backend)
        if not isinstance(chosen, NativeInstall):
            return chosen.state(self.recipe, backend)
        if chosen.tag is not None:
            return self._bins.signals(self._tagged_state(chosen, backend), chosen.bin_key(backend), backend,
                                      self.installer.version, install_action(self.recipe, backend))
        report = detect_devices()
        devices = backend_devices(backend, report)
        version = self.installer.version
        action = install_action(self.recipe, backend)
        installed = self.installer.installed_version(backend)
        if self.installer.built_with_other_flags(backend):
            return BackendState(self.recipe, backend, "update_required", action=action, version=installed,
                                devices=devices, message=f"The installed {self.product} was built with other "
                                "options than this Lemonade uses for this machine (e.g. with AMX kernels); rebuild it.")
        if installed == version:
            return BackendState(self.recipe, backend, "installed", version=installed, devices=devices)
        if installed is not None or self.installer.backend_dir(backend).exists():
            return BackendState(self.recipe, backend, "update_required",
                                message=f"Backend update is required before use (installed {installed}, this "
                                        f"Lemonade uses {version}).",
                                action=action, version=installed, devices=devices)
        if not devices:  # a GPU backend without a GPU: installed only on request (`force`)
            return BackendState(self.recipe, backend, "unsupported", message=unsupported_message(backend, report))
        official = "official " if backend == "cpu" else ""
        how = (f"downloads the {official}{self.product} release archive, or builds it from source when that is "
               f"unreachable" if self.installer.release_asset(backend) else f"builds {self.product} from source")
        needs = "cmake and a C++ compiler" + (", glslc and the Vulkan headers" if backend == "vulkan" else "")
        longer = "" if backend == "cpu" else "; longer for a GPU backend"
        return BackendState(self.recipe, backend, "installable",
                            message=f"Backend is supported but not installed. Installing it {how} "
                                    f"({self.build_minutes} minutes on 2 cores{longer}; needs {needs}).",
                            action=action, version=version, devices=devices)

    def _tagged_state(self, chosen: NativeInstall, backend: str) -> BackendState:
        """Another upstream release than the pinned one (`<section>.<backend>_bin` = a tag or `latest`)."""
        report = detect_devices()
        devices = backend_devices(backend, report)
        if chosen.installed_version(backend) == chosen.tag:
            return BackendState(self.recipe, backend, "installed", version=chosen.tag, devices=devices)
        key = chosen.bin_key(backend)
        if chosen.release_asset(backend) is None:
            return BackendState(self.recipe, backend, "unsupported", version=chosen.tag,
                                message=chosen.no_archive_message(backend), action=f"lemonade config set {key}=builtin")
        if not devices:
            return BackendState(self.recipe, backend, "unsupported", message=unsupported_message(backend, report))
        return BackendState(self.recipe, backend, "installable", version=chosen.tag, devices=devices,
                            action=install_action(self.recipe, backend),
                            message=f"Release {chosen.tag} ({key}) is not installed yet; installing it downloads "
                                    "the release archive.")

    # ----- which backend a load uses -------------------------------------------------------------------
    def default_backend(self) -> str:
        """`vulkan` where a Vulkan GPU is (llamacpp.gpu.backend_devices, which leaves software renderers
        out), else `cpu`: what `auto`, the default of `<section>.backend`, means."""
        return "vulkan" if backend_devices("vulkan", detect_devices()) else "cpu"

    def requested_backend(self, options: dict[str, Any]) -> str:
        value = options.get(self.backend_option) if self.backend_option else None
        return self.default_backend() if value in (None, "", "auto") else value

    def device(self, backend: str) -> str:
        """What a model on `backend` runs on (health `device`): a software Vulkan device is the CPU."""
        return "gpu" if uses_gpu(backend, detect_devices()) else "cpu"

    def engine_env(self, backend: str = "cpu") -> dict[str, str]:
        """The environment of a process of `backend`: a release archive's binaries find their shared
        libraries next to them; on `vulkan` without a Vulkan GPU, the software device is named, as
        ggml skips it otherwise (and the load would silently run without the device it asked for)."""
        folder = str(self.installer_for(backend).backend_dir(backend))
        old = os.environ.get("LD_LIBRARY_PATH")
        env = {**os.environ, "LD_LIBRARY_PATH": folder + (os.pathsep + old if old else "")}
        report = detect_devices()
        if backend == "vulkan" and (visible := vulkan_visible_devices(report)) is not None:
            log.warning("The %s vulkan backend runs on the software renderer %s (no Vulkan GPU on this machine)",
                        self.product, report.vulkan[0].name)
            env["GGML_VK_VISIBLE_DEVICES"] = visible
        return env

    # ----- install / uninstall -------------------------------------------------------------------------
    def check_request(self, backend: str, force: bool = False) -> None:
        """Refuse unknown backends and those this build does not install; `force` installs a GPU backend
        on a machine without such a GPU (its software renderer, or for a GPU added later)."""
        if backend not in self.backends:
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        if backend not in INSTALLED_BACKENDS:
            raise InstallError(f"{self.recipe}:{backend} cannot be installed: {self.unsupported_message(backend)}",
                               code="unsupported_backend")
        if force or not isinstance(self.installer_for(backend), NativeInstall):
            return  # an own build or an unresolved `latest` says what is wrong when installed
        st = self.state(backend)
        if st.state == "unsupported":
            hint = (f" Install it anyway with force (`lemonade backends install {self.recipe}:{backend} --force`, "
                    "or \"force\": true)." if not backend_devices(backend, detect_devices()) else "")
            raise InstallError(f"{self.recipe}:{backend} cannot be installed: {st.message}.{hint}",
                               code="unsupported_backend")

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend, force)
        chosen = self.installer_for(backend, installing=True)
        return {"recipe": self.recipe, **chosen.install_pinned(backend, progress, force)}

    def uninstall_refusal(self, backend: str) -> str | None:
        if backend in INSTALLED_BACKENDS and isinstance(self.installer_for(backend), OwnNativeBuild):
            try:
                self.uninstall(backend)  # raises, saying whose it is
            except InstallError as exc:
                return str(exc)
        return None

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend not in self.backends:
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        if backend not in INSTALLED_BACKENDS:
            raise InstallError(f"{self.recipe}:{backend} is not installed by this build: "
                               f"{self.unsupported_message(backend)}", code="unsupported_backend")
        return self.installer_for(backend).remove(backend)
