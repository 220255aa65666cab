"""Auto-tune at load time: the archetype detected once at startup, the profiles that match it, and
the options they give a model (auto-tune.md, phase 2).

The fallback chain: the first profile along the archetype's lookup chain (exact id, family, then
the CPU archetype's) that has options for the recipe and backend gives them, with its overlay for
the model on top; with none, the recipe's defaults stand. `runtime/options.py` puts the result
below everything the user set (request, saved options, config file, env, flags); the config key
`auto_tune` (default true) turns it off.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from lemonade.autotune.archetype import Archetype, MachineFacts, detect, local_facts
from lemonade.autotune.profiles import Profile, load_all
from lemonade.backends.registry import Engines
from lemonade.config import Config

log = logging.getLogger("lemonade.autotune")
MODEL_PREFIXES = ("builtin.", "extra.", "user.")  # canonical-id namespaces a profile may leave out


def model_keys(model_name: str) -> tuple[str, ...]:
    """The names a profile's model overlay may use for a model: its canonical id, or the id without
    its namespace (`extra.gemma-3-270m-q4_k_m` -> `gemma-3-270m-q4_k_m`)."""
    keys = [model_name]
    for prefix in MODEL_PREFIXES:
        if model_name.startswith(prefix):
            keys.append(model_name[len(prefix):])
    return tuple(keys)


class AutoTune:
    """One server's auto-tune state. `facts` is for tests and tools that describe another machine."""

    def __init__(self, cache_dir: Path, config: Config, facts: MachineFacts | None = None,
                 engines: Engines | None = None) -> None:
        self.config = config
        self.engines = engines  # turns a backend setting such as "auto" into the backend a load uses
        self.local_dir = Path(cache_dir) / "autotune" / "profiles"
        self._facts = facts
        self._archetype: Archetype | None = None
        self._detected = False
        self._lock = threading.Lock()
        self.profiles, self.errors = load_all(self.local_dir)

    @property
    def archetype(self) -> Archetype | None:
        """Detected once and cached. The server starts detection in a thread right after startup
        (`Services.start`), so the device tools never delay `/live`; a load that comes first waits."""
        with self._lock:
            if not self._detected:
                try:
                    self._archetype = detect(self._facts or local_facts())
                except Exception as exc:  # detection must never keep a model from loading
                    log.error("Auto-tune: could not detect the hardware archetype: %s", exc)
                self._detected = True
                if self._archetype is not None:
                    found = [p.archetype for p in self._chain(self._archetype)]
                    log.info("Auto-tune: archetype %s; profiles %s", self._archetype.id, ", ".join(found) or "none")
            return self._archetype

    def _chain(self, archetype: Archetype) -> list[Profile]:
        return [self.profiles[i] for i in archetype.lookup if i in self.profiles]

    @property
    def enabled(self) -> bool:
        return bool(self.config.get("auto_tune"))

    def matching(self) -> list[Profile]:
        """Profiles along the archetype's lookup chain, most specific first."""
        archetype = self.archetype
        return self._chain(archetype) if archetype is not None else []

    def choose(self, model_name: str, recipe: str, backend: str | None) -> tuple[Profile | None, dict[str, Any],
                                                                                   bool]:
        """(profile, options, model overlay applied?) for a model on a backend (None: any backend)."""
        if not self.enabled:
            return None, {}, False
        engine = self.engines.get(recipe) if self.engines is not None else None
        if backend is not None and engine is not None and engine.backend_option:
            backend = engine.requested_backend({engine.backend_option: backend})
        for profile in self.matching():
            values, overlay = profile.block(recipe, backend, model_keys(model_name))
            if values:
                return profile, values, overlay
        return None, {}, False

    def values(self, model_name: str, recipe: str, backend: str | None) -> dict[str, Any]:
        """The options auto-tune gives (what `RecipeOptions.resolve` layers in)."""
        return self.choose(model_name, recipe, backend)[1]

    def describe(self) -> dict[str, Any]:
        """`auto_tune` of `/v1/health`: on or off, the archetype, the profiles that match, bad files."""
        if not self._detected:  # never wait for the device tools here (health is polled)
            return {"enabled": self.enabled, "archetype": None, "detecting": True, "profiles": [],
                    "errors": list(self.errors)}
        archetype = self.archetype
        return {"enabled": self.enabled,
                "archetype": archetype.to_dict() if archetype else None,
                "profiles": [p.archetype for p in self.matching()],
                "errors": list(self.errors)}

    def for_loaded(self, model_name: str, recipe: str, backend: str | None,
                   effective: dict[str, Any]) -> dict[str, Any] | None:
        """A loaded model's `auto_tune`: the profile used and the overrides still in force in its
        options (the ones the user's own options did not replace)."""
        from lemonade.runtime.options import tuned_in_force

        profile, values, overlay = self.choose(model_name, recipe, backend)
        if profile is None:
            return None
        return {"profile": profile.archetype, "model_overlay": overlay,
                "overrides": tuned_in_force(values, effective)}
