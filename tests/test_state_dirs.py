"""Where state lives (lemonade/paths.py) and the one-time move of persistent JSON from the cache dir
to the config dir (lemonade/legacy_state.py), including a move killed half-way (a real SIGKILL of
a real migration process at each step) and finished by the next run. No server needed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lemonade.legacy_state import MigrationError, migrate_legacy_state
from lemonade.paths import PERSISTENT_FILES, cache_dir, config_dir

HOME = {"HOME": "/home/u"}


def test_default_locations_follow_the_guide():
    assert config_dir(HOME, create=False) == Path("/home/u/.config/lemonade")
    assert cache_dir(HOME, create=False) == Path("/home/u/.cache/lemonade")


@pytest.mark.parametrize(("env", "config", "cache"), [
    ({"LEMONADE_CONFIG_DIR": "/c", "LEMONADE_CACHE_DIR": "/k"}, "/c", "/k"),
    # a custom cache dir alone moves only the cache, as Lemonade's server does: the configuration stays
    # in the platform's config dir (`lemond CACHE_DIR` keeps both together: tests/test_lemond.py)
    ({"LEMONADE_CACHE_DIR": "/k"}, "/home/u/.config/lemonade", "/k"),
    ({"LEMONADE_CACHE_DIR": "/k", "XDG_CONFIG_HOME": "/x/conf"}, "/x/conf/lemonade", "/k"),
    # the packaged systemd service: StateDirectory= and CacheDirectory=
    ({"STATE_DIRECTORY": "/var/lib/lemonade", "CACHE_DIRECTORY": "/var/cache/lemonade"},
     "/var/lib/lemonade", "/var/cache/lemonade"),
    ({"XDG_CONFIG_HOME": "/x/conf", "XDG_CACHE_HOME": "/x/cache"}, "/x/conf/lemonade", "/x/cache/lemonade"),
])
def test_overrides(env, config, cache):
    assert config_dir({**HOME, **env}, create=False) == Path(config)
    assert cache_dir({**HOME, **env}, create=False) == Path(cache)


def _legacy(cache: Path) -> dict[str, bytes]:
    """Every persistent file in the old place, each with content of its own."""
    cache.mkdir(parents=True, exist_ok=True)
    contents = {name: json.dumps({"file": name, "n": i}).encode() for i, name in enumerate(PERSISTENT_FILES)}
    for name, data in contents.items():
        (cache / name).write_bytes(data)
    return contents


def test_moves_every_persistent_file_once(tmp_path):
    cache, config = tmp_path / "cache", tmp_path / "config"
    contents = _legacy(cache)
    (cache / "downloads.json").write_text("[]")  # download state belongs with the partial files: stays
    report = migrate_legacy_state(cache, config)
    assert len(report.done) == len(PERSISTENT_FILES) and not report.warnings
    assert {p.name: p.read_bytes() for p in config.iterdir()} == contents
    assert sorted(p.name for p in cache.iterdir()) == ["downloads.json"]
    again = migrate_legacy_state(cache, config)
    assert again.done == [] and again.warnings == []


def test_same_folder_is_left_alone(tmp_path):
    contents = _legacy(tmp_path)
    assert migrate_legacy_state(tmp_path, tmp_path).done == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == contents


def test_a_file_in_both_places_that_differs_is_kept_and_named(tmp_path):
    cache, config = tmp_path / "cache", tmp_path / "config"
    _legacy(cache)
    config.mkdir()
    (config / "user_models.json").write_text('{"newer": {}}')
    report = migrate_legacy_state(cache, config)
    assert (config / "user_models.json").read_text() == '{"newer": {}}'  # the config dir's copy is used
    assert (cache / "user_models.json").is_file()  # and the other one is not thrown away
    assert any("user_models.json" in w and str(cache / "user_models.json") in w for w in report.warnings)


def test_a_config_dir_that_cannot_be_written_stops_the_move_and_loses_nothing(tmp_path):
    cache, config = tmp_path / "cache", tmp_path / "config"
    contents = _legacy(cache)
    config.write_text("a file where the folder should be")  # fails for root too, unlike a chmod
    with pytest.raises(MigrationError, match="LEMONADE_CONFIG_DIR"):
        migrate_legacy_state(cache, config)
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == contents


# The migration run in a process of its own that is killed (SIGKILL, no clean-up of any kind) at one
# step of moving the first file: after writing the temp copy, after renaming it into place, or after
# removing the old file. Only the chosen step is intercepted (by wrapping the OS call the module makes);
# everything else, including the file system, is real.
KILLER = """
import os, signal, sys
from pathlib import Path
import lemonade.legacy_state as m
step = sys.argv[3]
def kill():
    os.kill(os.getpid(), signal.SIGKILL)
real_replace, real_unlink = os.replace, Path.unlink
if step == "before-rename":
    os.replace = lambda a, b: kill()
elif step == "before-unlink":
    Path.unlink = lambda self, missing_ok=False: kill()
elif step == "after-unlink":
    def unlink(self, missing_ok=False):
        real_unlink(self, missing_ok)
        kill()
    Path.unlink = unlink
m.migrate_legacy_state(Path(sys.argv[1]), Path(sys.argv[2]))
"""


@pytest.mark.parametrize("step", ["before-rename", "before-unlink", "after-unlink"])
def test_a_migration_killed_half_way_is_finished_by_the_next_run(tmp_path, step):
    cache, config = tmp_path / "cache", tmp_path / "config"
    contents = _legacy(cache)
    proc = subprocess.run([sys.executable, "-c", KILLER, str(cache), str(config), step], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # Killed: every file is complete in one place or the other (a temp file may lie around).
    for name, data in contents.items():
        copies = [p.read_bytes() for p in (cache / name, config / name) if p.exists()]
        assert copies and all(c == data for c in copies), name
    migrate_legacy_state(cache, config)  # the next start
    assert {p.name: p.read_bytes() for p in config.iterdir() if not p.name.startswith(".")} == contents
    assert not any(cache.iterdir())  # nothing left behind twice
