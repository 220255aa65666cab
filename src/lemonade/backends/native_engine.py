"""Backend state, install and uninstall of an engine whose one backend is `cpu`: pinned native sources
(a release archive where upstream publishes one, else a source build), installed by a `NativeInstall`.

Why a mixin: whisper.cpp and stable-diffusion.cpp answer these questions the same way, word for word
but for the product's name and build time; each engine keeps only what differs (`product`,
`build_minutes`, `release_asset`, `unsupported_message`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lemonade.backends.bin_select import BinChoice, LatestTag, Unresolved, latest_release_tag
from lemonade.backends.engine import BackendState, InstallError, Progress, install_action
from lemonade.backends.native_bins import OwnNativeBuild
from lemonade.backends.native_install import NativeInstall

if TYPE_CHECKING:
    from lemonade.config import Config


class NativeCpuBackend:
    """Mixed into an `Engine` (before it): `state`, `install` and `uninstall` for the `cpu` backend."""

    recipe: ClassVar[str]
    backends: ClassVar[tuple[str, ...]]
    installer: NativeInstall  # the pinned version ("builtin")
    config: Config  # the Engine's
    cache_dir: Path  # the Engine's
    check_request: Callable[..., None]  # the Engine's
    product = ""  # the upstream project's name, e.g. "whisper.cpp"
    build_minutes = ""  # a source build's time on 2 cores, e.g. "3 to 8"

    def release_asset(self) -> str | None:
        """The release archive upstream publishes for this machine, None where a source build is the way."""
        raise NotImplementedError

    def unsupported_message(self, backend: str) -> str:
        """Why `backend` (not cpu) cannot be used here, and what to use instead."""
        raise NotImplementedError

    # ----- which build `<section>.cpu_bin` selects (native_bins.py) -----------------------------------
    def installer_for(self, backend: str, installing: bool = False) -> NativeInstall | OwnNativeBuild | Unresolved:
        """The pinned install, another release's, or the user's own build: what `<section>.<backend>_bin`
        selects to run, or with `installing`, what an install applies (`latest`'s newer release). Only
        `cpu` is served, so the others are always the pinned installer's to refuse."""
        if backend != "cpu":
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

    def state(self, backend: str) -> BackendState:
        if backend != "cpu":
            return BackendState(self.recipe, backend, "unsupported", message=self.unsupported_message(backend))
        chosen = self.installer_for(backend)
        if not isinstance(chosen, NativeInstall):
            return chosen.state(self.recipe, backend)
        if chosen.tag is not None:
            return self._bins.signals(self._tagged_state(chosen), chosen.bin_key(backend), backend,
                                      self.installer.version, install_action(self.recipe, backend))
        version = self.installer.version
        action = install_action(self.recipe, "cpu")
        installed = self.installer.installed_version("cpu")
        if self.installer.built_with_other_flags("cpu"):
            return BackendState(self.recipe, "cpu", "update_required", action=action, version=installed,
                                devices=["cpu"], message=f"The installed {self.product} was built with other "
                                "options than this Lemonade uses for this CPU (e.g. with AMX kernels); rebuild it.")
        if installed == version:
            return BackendState(self.recipe, "cpu", "installed", version=installed, devices=["cpu"])
        if installed is not None or self.installer.backend_dir("cpu").exists():
            return BackendState(self.recipe, "cpu", "update_required",
                                message=f"Backend update is required before use (installed {installed}, this "
                                        f"Lemonade uses {version}).",
                                action=action, version=installed, devices=["cpu"])
        how = (f"downloads the official {self.product} release archive, or builds it from source when that is "
               f"unreachable" if self._release_pinned() else f"builds {self.product} from source")
        return BackendState(self.recipe, "cpu", "installable",
                            message=f"Backend is supported but not installed. Installing it {how} "
                                    f"({self.build_minutes} minutes on 2 cores; needs cmake and a C++ compiler).",
                            action=action, version=version, devices=["cpu"])

    def _tagged_state(self, chosen: NativeInstall) -> BackendState:
        """Another upstream release than the pinned one (`<section>.cpu_bin` = a tag or `latest`)."""
        if chosen.installed_version("cpu") == chosen.tag:
            return BackendState(self.recipe, "cpu", "installed", version=chosen.tag, devices=["cpu"])
        key = chosen.bin_key("cpu")
        if chosen.release_asset() is None:
            return BackendState(self.recipe, "cpu", "unsupported", version=chosen.tag,
                                message=chosen.no_archive_message(), action=f"lemonade config set {key}=builtin")
        return BackendState(self.recipe, "cpu", "installable", version=chosen.tag, devices=["cpu"],
                            action=install_action(self.recipe, "cpu"),
                            message=f"Release {chosen.tag} ({key}) is not installed yet; installing it downloads "
                                    "the official release archive.")

    def _release_pinned(self) -> bool:
        """A release archive exists for this machine (used once its SHA-256 is checked against a pin or
        the digest GitHub publishes for it, release_digests.py)."""
        return self.release_asset() is not None

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        self.check_request(backend)
        chosen = self.installer_for(backend, installing=True)
        return {"recipe": self.recipe, **chosen.install_pinned(backend, progress, force)}

    def uninstall_refusal(self, backend: str) -> str | None:
        if backend == "cpu" and isinstance(self.installer_for(backend), OwnNativeBuild):
            try:
                self.uninstall(backend)  # raises, saying whose it is
            except InstallError as exc:
                return str(exc)
        return None

    def uninstall(self, backend: str) -> dict[str, Any]:
        if backend not in self.backends:
            raise InstallError(f"Unknown {self.recipe} backend '{backend}' (known: {', '.join(self.backends)}).",
                               code="unknown_backend")
        if backend != "cpu":
            raise InstallError(f"{self.recipe}:{backend} is not installed by this build: "
                               f"{self.unsupported_message(backend)}", code="unsupported_backend")
        return self.installer_for(backend).remove(backend)
