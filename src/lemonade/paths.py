"""Where Lemonade keeps things on disk (guide-configuration-README.md).

Two folders with different lifetimes:

- the **config dir** holds the persistent JSON a user would miss after a `~/.cache` clean-up:
  `config.json`, `user_models.json`, `recipe_options.json`, `aliases.json`, `jobs.json` (cloud
  providers live in `config.json`). `~/.config/lemonade` by default.
- the **cache dir** holds what can be fetched or rebuilt again: engines (`backends/`), download
  state, build folders, logs, auto-tune measurements. `~/.cache/lemonade` by default.

Overrides, first match wins:

- cache dir: `LEMONADE_CACHE_DIR`, systemd's `CACHE_DIRECTORY`, `$XDG_CACHE_HOME/lemonade`, `~/.cache/lemonade`
- config dir: `LEMONADE_CONFIG_DIR`, systemd's `STATE_DIRECTORY` (the packaged service's
  `/var/lib/lemonade`), `$XDG_CONFIG_HOME/lemonade`, `~/.config/lemonade`.

`LEMONADE_CACHE_DIR` alone moves only the cache: the configuration stays where it was, as in
Lemonade's server (its `get_config_dir` does not read that variable), so cleaning up a moved cache
never resets the server. A portable install that keeps both together says so: `lemond CACHE_DIR`
(a cache dir given as an argument without a config dir, cli/lemond.py) or both variables.

State written by older versions into the cache dir is moved over by `lemonade.legacy_state`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# The persistent JSON files of the config dir, by name (older versions kept them in the cache dir).
PERSISTENT_FILES = ("config.json", "user_models.json", "recipe_options.json", "aliases.json", "jobs.json")


def _home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME") or str(Path.home())


def _resolve(raw: str, create: bool) -> Path:
    path = Path(raw).expanduser()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir(environ: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """The Lemonade cache dir (created on first use unless `create` is False)."""
    env = os.environ if environ is None else environ
    raw = (env.get("LEMONADE_CACHE_DIR") or env.get("CACHE_DIRECTORY")
           or (os.path.join(env["XDG_CACHE_HOME"], "lemonade") if env.get("XDG_CACHE_HOME") else None)
           or os.path.join(_home(env), ".cache", "lemonade"))
    return _resolve(raw, create)


def config_dir(environ: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """The Lemonade config dir (created on first use unless `create` is False)."""
    env = os.environ if environ is None else environ
    raw = (env.get("LEMONADE_CONFIG_DIR") or env.get("STATE_DIRECTORY")
           or (os.path.join(env["XDG_CONFIG_HOME"], "lemonade") if env.get("XDG_CONFIG_HOME") else None)
           or os.path.join(_home(env), ".config", "lemonade"))
    return _resolve(raw, create)


def backends_dir(cache: Path | None = None) -> Path:
    """Installed engine binaries: `<cache>/backends/<recipe>/<backend>/`."""
    return (cache or cache_dir()) / "backends"
