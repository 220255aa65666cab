"""The one-time move of persistent JSON from the cache dir (where older versions wrote it) to the
config dir (guide-configuration-README.md: "On startup, Lemonade automatically migrates persistent
JSON files from the legacy .cache location into the new .config location").

Crash-safe, file by file: the new copy is written to a temp file, fsynced and renamed into place,
the config dir is fsynced, and only then is the old file removed. Whatever step a crash (or a full
disk) interrupts, the next start finds one of these and finishes without losing or duplicating
anything:

- only the old file: nothing was moved yet (a temp file may be left; it is replaced);
- both, with the same bytes: the copy was complete, the removal was not: the old one is removed;
- both, different: not our doing (an older Lemonade wrote the old one again, or a user copied
  files by hand): the config dir's file is used and the old one is left where it is, with a warning
  that names both, so nothing is lost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lemonade.paths import PERSISTENT_FILES
from lemonade.util.atomic import atomic_write_bytes


@dataclass
class MigrationReport:
    """What a start did, for the startup log (written once logging is set up)."""

    done: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class MigrationError(RuntimeError):
    """A file could not be copied to the config dir; the old one is untouched."""


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _fsync_dir(folder: Path) -> None:
    """Make a rename or removal in `folder` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def migrate_legacy_state(cache: Path, config: Path) -> MigrationReport:
    """Move the persistent JSON files of `cache` into `config`. Raises MigrationError when a copy
    cannot be made."""
    cache, config = Path(cache), Path(config)
    report = MigrationReport()
    if _same_dir(cache, config) or not cache.is_dir():
        return report
    for name in PERSISTENT_FILES:
        old, new = cache / name, config / name
        if not old.is_file():
            continue
        if new.exists():
            if new.is_file() and _same_bytes(old, new):
                _remove(old, report)
                report.done.append(f"Finished moving {name} to {config} (removed the old copy in {cache})")
            else:
                report.warnings.append(f"{name} exists in both the config dir ({new}, used) and the old location "
                                       f"({old}, ignored); keep what you need in {new} and delete {old}")
            continue
        try:
            atomic_write_bytes(new, old.read_bytes())
        except OSError as exc:
            raise MigrationError(f"Cannot move {old} to {new}: {exc}. Make {config} writable (or set "
                                 "LEMONADE_CONFIG_DIR to a writable folder) and start again; nothing was "
                                 "lost.") from exc
        _fsync_dir(config)
        _remove(old, report)
        report.done.append(f"Moved {name} from {cache} to {config}")
    return report


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def _remove(old: Path, report: MigrationReport) -> None:
    """The last step; failing here loses nothing (the copy is complete), so it only warns, and the
    next start retries it."""
    try:
        old.unlink()
        _fsync_dir(old.parent)
    except OSError as exc:
        report.warnings.append(f"Copied {old.name} to the config dir but could not remove the old copy {old} "
                               f"({exc}); it is removed at the next start")


def local_config_dir() -> Path:
    """The config dir with any legacy files moved in: what the CLI reads and writes when no server
    runs, so `lemonade config set` before the first start of a new version edits the moved file."""
    from lemonade.paths import cache_dir, config_dir

    folder = config_dir()
    migrate_legacy_state(cache_dir(), folder)
    return folder
