"""Issue 10: the model naming spec (guide-configuration-custom-models.md, "Model naming spec").

Table-driven, one case per rule, against the real catalog (no server): built-in models from the
shipped catalog, `user_models.json` entries and an extra models dir of metadata-only GGUFs
(tests/gguf_factory.py; nothing here is loaded into an engine). The same rules through the HTTP API
are in test_catalog.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lemonade.catalog.catalog import Catalog, RegistrationError
from lemonade.catalog.naming import public_ids, reserved_problem, split
from lemonade.config import Config
from lemonade.runtime.options import RecipeOptions
from tests.gguf_factory import write_gguf

BUILTIN = "Qwen3-0.6B-GGUF"      # shipped built-ins the cases shadow
BUILTIN2 = "Gemma-3-4b-it-GGUF"
BUILTIN3 = "Whisper-Tiny"


def user_entry(repo: str = "someone/repo:Q4_K_M") -> dict[str, str]:
    return {"recipe": "llamacpp", "checkpoint": repo}


def make_catalog(tmp_path: Path, user: dict[str, dict] | None = None, extra: list[str] = ()) -> Catalog:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    if user:
        (cache / "user_models.json").write_text(json.dumps(user))
    root = tmp_path / "extra"
    for rel in extra:
        write_gguf(root / rel, clip="mmproj" in rel)
    return Catalog(cache, str(root) if root.exists() else "")


def listed(catalog: Catalog) -> dict[str, str]:
    """public id -> canonical id, as /v1/models lists them."""
    out = {m.public: m.name for m in catalog.all()}
    assert len(out) == len(catalog.all()), "two models listed under one id"
    return out


# ----- the spec's five reference cases -------------------------------------------------------------

CASES = [
    # (user entries, extra files, the ids listed for that bare name, name -> canonical id it resolves to)
    pytest.param({}, [], {BUILTIN: f"builtin.{BUILTIN}"},
                 {BUILTIN: f"builtin.{BUILTIN}", f"builtin.{BUILTIN}": f"builtin.{BUILTIN}",
                  f"user.{BUILTIN}": None, f"extra.{BUILTIN}": None}, id="builtin-only"),
    pytest.param({BUILTIN: user_entry()}, [], {BUILTIN: f"user.{BUILTIN}", f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"},
                 {BUILTIN: f"user.{BUILTIN}", f"user.{BUILTIN}": f"user.{BUILTIN}",
                  f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"}, id="builtin+registered"),
    pytest.param({BUILTIN: user_entry()}, [f"{BUILTIN}.gguf"],
                 {BUILTIN: f"user.{BUILTIN}", f"extra.{BUILTIN}": f"extra.{BUILTIN}",
                  f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"},
                 {BUILTIN: f"user.{BUILTIN}", f"user.{BUILTIN}": f"user.{BUILTIN}",
                  f"extra.{BUILTIN}": f"extra.{BUILTIN}", f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"},
                 id="three-way"),
    pytest.param({}, [f"{BUILTIN}.gguf"], {BUILTIN: f"extra.{BUILTIN}", f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"},
                 {BUILTIN: f"extra.{BUILTIN}", f"extra.{BUILTIN}": f"extra.{BUILTIN}",
                  f"builtin.{BUILTIN}": f"builtin.{BUILTIN}", f"user.{BUILTIN}": None}, id="builtin+extra"),
    pytest.param({"MyModel": user_entry()}, [], {"MyModel": "user.MyModel"},
                 {"MyModel": "user.MyModel", "user.MyModel": "user.MyModel", "builtin.MyModel": None,
                  "extra.MyModel": None}, id="registered-only"),
]


@pytest.mark.parametrize("user,extra,ids,resolves", CASES)
def test_reference_cases(tmp_path, user, extra, ids, resolves):
    catalog = make_catalog(tmp_path, user, extra)
    bare = next(iter(ids))
    shown = {k: v for k, v in listed(catalog).items() if split(k)[1] == bare}
    assert shown == ids  # one bare row plus one canonical row per shadowed source
    for name, canonical in resolves.items():
        model = catalog.find(name)
        assert (model.name if model else None) == canonical, name
        if model is not None:
            assert catalog.find(model.public) is model  # every listed id resolves back to its model


def test_three_way_is_stable_across_restarts_and_listing_order(tmp_path):
    first = make_catalog(tmp_path, {BUILTIN: user_entry()}, [f"{BUILTIN}.gguf"])
    again = make_catalog(tmp_path)  # same files, a new process's view
    assert listed(first) == listed(again)
    for name in (BUILTIN, f"user.{BUILTIN}", f"extra.{BUILTIN}", f"builtin.{BUILTIN}"):
        assert first.find(name).name == again.find(name).name
    # the answer does not depend on the order the sources are enumerated in
    ids = [f"builtin.{BUILTIN}", f"extra.{BUILTIN}", f"user.{BUILTIN}"]
    assert public_ids(ids) == public_ids(reversed(ids)) == {
        f"user.{BUILTIN}": BUILTIN, f"extra.{BUILTIN}": f"extra.{BUILTIN}", f"builtin.{BUILTIN}": f"builtin.{BUILTIN}"}


def test_registering_a_shadow_renames_the_builtin_row_and_deleting_restores_it(tmp_path):
    catalog = make_catalog(tmp_path)
    builtin = catalog.find(BUILTIN2)
    assert builtin.public == BUILTIN2
    catalog.register({"model_name": f"user.{BUILTIN2}", **user_entry()})
    assert builtin.public == f"builtin.{BUILTIN2}" and catalog.find(BUILTIN2).name == f"user.{BUILTIN2}"
    catalog.unregister(f"user.{BUILTIN2}")
    assert builtin.public == BUILTIN2 and catalog.find(BUILTIN2) is builtin


def test_model_ids_win_over_aliases_and_builtin_names_ignore_case(tmp_path):
    catalog = make_catalog(tmp_path, {"Mine": user_entry()})
    catalog.set_alias("fast", "Mine")
    assert catalog.find("fast").name == "user.Mine"
    assert catalog.find("qwen3-0.6b-gguf").name == f"builtin.{BUILTIN}"
    assert catalog.find(f"builtin.{BUILTIN.lower()}").name == f"builtin.{BUILTIN}"
    assert catalog.find("mine") is None  # only built-in names are case-insensitive, as in Lemonade
    assert catalog.find(f"{BUILTIN}:latest").name == f"builtin.{BUILTIN}"  # Ollama's default tag
    for alias in ("Mine", "user.x", "extra.x", "builtin.x"):
        with pytest.raises(RegistrationError):
            catalog.set_alias(alias, "Mine")


# ----- reserved prefixes at registration -----------------------------------------------------------

@pytest.mark.parametrize("name,problem", [
    ("builtin.Foo", "'builtin.' prefix is reserved"),
    ("extra.Foo", "'extra.' prefix is reserved"),
    (f"user.builtin.{BUILTIN}", "cannot start with the reserved prefix 'builtin.'"),
    ("user.extra.Foo", "cannot start with the reserved prefix 'extra.'"),
    ("user.user.Foo", "cannot start with the reserved prefix 'user.'"),
    ("user.Foo", None),
    ("user.Qwen2.5-Coder", None),  # dots inside a name are fine
])
def test_reserved_prefixes(tmp_path, name, problem):
    assert (reserved_problem(name) is None) == (problem is None)
    catalog = make_catalog(tmp_path)
    if problem is None:
        assert catalog.register({"model_name": name, **user_entry()}).name == name
        return
    with pytest.raises(RegistrationError, match=problem.replace(".", r"\.")):
        catalog.register({"model_name": name, **user_entry()})
    assert not (tmp_path / "cache" / "user_models.json").exists()


# ----- extra models dir: one case per naming rule ------------------------------------------------

EXTRA_RULES = [
    # (files under the extra dir, listed id, its main file (relative), hidden names that also resolve)
    (["Qwen3-8B-Q4_K_M.gguf"], "Qwen3-8B-Q4_K_M", "Qwen3-8B-Q4_K_M.gguf", ["extra.Qwen3-8B-Q4_K_M.gguf"]),
    (["big-00001-of-00002.gguf", "big-00002-of-00002.gguf"], "big", "big-00001-of-00002.gguf", []),
    (["gemma-3-4b-it-Q8_0/model.gguf"], "gemma-3-4b-it-Q8_0", "gemma-3-4b-it-Q8_0/model.gguf", []),
    (["sharded/m-Q8_0-00001-of-00002.gguf", "sharded/m-Q8_0-00002-of-00002.gguf"], "sharded",
     "sharded/m-Q8_0-00001-of-00002.gguf", []),
    (["vlm/model-Q4_K_M.gguf", "vlm/mmproj-model-f16.gguf"], "vlm", "vlm/model-Q4_K_M.gguf", []),
    (["quants/Qwen3-8B-Q4_K_M.gguf", "quants/Qwen3-8B-Q8_0.gguf"], "Qwen3-8B-Q4_K_M",
     "quants/Qwen3-8B-Q4_K_M.gguf", ["extra.quants"]),
    (["quants/Qwen3-8B-Q4_K_M.gguf", "quants/Qwen3-8B-Q8_0.gguf"], "Qwen3-8B-Q8_0", "quants/Qwen3-8B-Q8_0.gguf", []),
    (["two/a-Q8_0-00001-of-00002.gguf", "two/a-Q8_0-00002-of-00002.gguf", "two/a-Q4_0.gguf"], "a-Q8_0",
     "two/a-Q8_0-00001-of-00002.gguf", []),
    (["models--org--Repo-GGUF/snapshots/abc123/r-Q4_0.gguf", "models--org--Repo-GGUF/refs/main.txt"], "Repo-GGUF",
     "models--org--Repo-GGUF/snapshots/abc123/r-Q4_0.gguf", []),
    (["Llama-Local-GGUF/model-Q4_K_M.gguf", "Llama-Local-GGUF/model-Q8_0.gguf",
      "Mistral-Local-GGUF/model-Q4_K_M.gguf", "Mistral-Local-GGUF/model-Q8_0.gguf"],
     "Mistral-Local-GGUF-model-Q8_0", "Mistral-Local-GGUF/model-Q8_0.gguf", []),
    (["dup.gguf", "dup/m.gguf"], "dup-dup", "dup/m.gguf", []),
    (["a/dup/m.gguf", "b/dup/m.gguf", "c/dup/m.gguf"], "c-dup", "c/dup/m.gguf", []),
    # Files that do not all name a quantization: the folder stays one model, served from its first file.
    (["mixed/a.gguf", "mixed/b-Q4_0.gguf"], "mixed", "mixed/a.gguf", []),
    # Sharing a quantization does not make two files one shard set.
    (["im/Model-Q4_K_M.gguf", "im/Model-Q4_K_M-imatrix.gguf"], "Model-Q4_K_M-imatrix",
     "im/Model-Q4_K_M-imatrix.gguf", ["extra.im"]),
    (["im/Model-Q4_K_M.gguf", "im/Model-Q4_K_M-imatrix.gguf"], "Model-Q4_K_M", "im/Model-Q4_K_M.gguf", []),
    # Shard sets named with `.` or `_` before the index.
    (["dots/m-Q4_0.00001-of-00002.gguf", "dots/m-Q4_0.00002-of-00002.gguf", "dots/m-Q8_0_00001-of-00002.gguf",
      "dots/m-Q8_0_00002-of-00002.gguf"], "m-Q8_0", "dots/m-Q8_0_00001-of-00002.gguf", []),
]


@pytest.mark.parametrize("files,name,main,hidden", EXTRA_RULES,
                         ids=["root-file-stem", "root-shard-series", "folder-of-one", "folder-shard-set",
                              "folder-mmproj-vision", "variants-one-each", "variants-second", "sharded-variant",
                              "hf-snapshot", "collision-qualified-by-folder", "root-file-beats-folder",
                              "three-way-folder-collision", "unnamed-files-stay-one-model",
                              "imatrix-is-another-model", "imatrix-beside-it", "dot-and-underscore-shards"])
def test_extra_dir_naming(tmp_path, files, name, main, hidden):
    root = tmp_path / "extra"
    for rel in files:
        if rel.endswith("refs/main.txt"):  # the cache's ref file (no extension in a real cache)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).with_suffix("").write_text("abc123")
            continue
        write_gguf(root / rel, clip="mmproj" in rel, split=_split(rel))
    catalog = Catalog(tmp_path / "cache", str(root))
    ids = listed(catalog)
    assert name in ids, ids
    model = catalog.find(name)
    assert model.local_files["main"][0] == root / main
    assert catalog.find("extra." + name) is model
    for h in hidden:
        assert catalog.find(h) is model and h not in ids
    if "mmproj" in " ".join(files):
        assert model.labels == ["custom", "vision"] and model.local_files["mmproj"][0].name.startswith("mmproj")
    assert not [i for i in ids if "mmproj" in i]


def _split(rel: str) -> tuple[int, int] | None:
    for n in (1, 2):
        if f"0000{n}-of-00002" in rel:
            return (n, 2)
    return None


def test_extra_checkpoints_and_sizes_as_lemonade_reports_them(tmp_path):
    """A file model's checkpoint is its file, a folder model's the folder; sizes are GiB of the files
    (a folder model's: every GGUF in it, shards and projector included); the projector is named."""
    root = tmp_path / "extra"
    for rel in ("root-Q4_0.gguf", "vlm/m-Q4_K_M.gguf", "vlm/m-Q8_0.gguf", "vlm/mmproj-z.gguf", "vlm/mmproj-a.gguf",
                "big/b-00001-of-00002.gguf", "big/b-00002-of-00002.gguf"):
        write_gguf(root / rel, clip="mmproj" in rel, split=_split(rel))
    with open(root / "big" / "b-00002-of-00002.gguf", "r+b") as f:
        f.truncate(3 * 1024 * 1024)  # the bulk of a shard set is in its later shards
    catalog = Catalog(tmp_path / "cache", str(root))
    ids = listed(catalog)
    gib = 1024 ** 3

    def size(*rels: str) -> float:
        return round(sum((root / r).stat().st_size for r in rels) / gib, 3)

    root_model = catalog.find("root-Q4_0")
    assert root_model.checkpoints == {"main": str(root / "root-Q4_0.gguf")}
    assert root_model.size == size("root-Q4_0.gguf")
    q4 = catalog.find("m-Q4_K_M")
    assert q4.checkpoints == {"main": str(root / "vlm" / "m-Q4_K_M.gguf"), "mmproj": "mmproj-a.gguf"}
    assert q4.size == size("vlm/m-Q4_K_M.gguf") and q4.local_files["mmproj"] == [root / "vlm" / "mmproj-a.gguf"]
    assert catalog.find("vlm") is q4 and catalog.find("extra.vlm") is q4 and "vlm" not in ids
    big = catalog.find("big")
    assert big.checkpoints == {"main": str(root / "big")}
    assert big.size == size("big/b-00001-of-00002.gguf", "big/b-00002-of-00002.gguf") > 0.002
    assert big.local_files["main"] == [root / "big" / "b-00001-of-00002.gguf", root / "big" / "b-00002-of-00002.gguf"]


def test_a_split_folder_name_shadows_a_builtin_without_being_listed(tmp_path):
    """The folder name of split variants still resolves (to the first file's variant) and takes that
    bare name from a built-in model, which is then listed under its canonical id."""
    catalog = make_catalog(tmp_path, extra=[f"{BUILTIN}/Local-Q4_K_M.gguf", f"{BUILTIN}/Local-Q8_0.gguf"])
    ids = listed(catalog)
    assert BUILTIN not in ids and ids[f"builtin.{BUILTIN}"] == f"builtin.{BUILTIN}"
    assert {"Local-Q4_K_M", "Local-Q8_0"} <= set(ids)
    assert catalog.find(BUILTIN).name == "extra.Local-Q4_K_M"
    assert catalog.find(f"builtin.{BUILTIN}").origin == "builtin"


def test_extra_names_do_not_depend_on_creation_order(tmp_path):
    """The same tree written in two orders (so the disk lists it differently) names alike."""
    files = ["b/dup/m.gguf", "a/dup/m.gguf", "z.gguf", "dup/m.gguf", "c/dup/m.gguf"]
    views = []
    for i, order in enumerate((files, list(reversed(files)))):
        root = tmp_path / f"extra{i}"
        for rel in order:
            write_gguf(root / rel)
        catalog = Catalog(tmp_path / f"cache{i}", str(root))
        views.append({m.public: str(m.local_files["main"][0].relative_to(root)) for m in catalog.all()
                      if m.origin == "extra"})
    assert views[0] == views[1] == {  # root files first, then folders in sorted path order: a/dup < ... < dup
        "z": "z.gguf", "dup": "a/dup/m.gguf", "b-dup": "b/dup/m.gguf", "c-dup": "c/dup/m.gguf",
        "dup-dup": "dup/m.gguf"}


# ----- recipe_options.json keyed by canonical id ------------------------------------------------------

def test_recipe_options_migrate_to_canonical_ids(tmp_path):
    catalog = make_catalog(tmp_path, {"Mine": user_entry()}, ["gemma.gguf"])
    path = tmp_path / "cache" / "recipe_options.json"
    path.write_text(json.dumps({
        BUILTIN: {"ctx_size": 1024},                 # bare built-in (older Lemonade) -> builtin.
        "extra.gemma.gguf": {"ctx_size": 2048},      # this server's old extra id -> extra.<stem>
        "Unknown-Model": {"ctx_size": 4096},         # names nothing: kept as it is
        "user.Mine": {"ctx_size": 512},              # already canonical
        BUILTIN3: {"ctx_size": 1},                   # its canonical key exists: left alone
        f"builtin.{BUILTIN3}": {"ctx_size": 2},
    }))
    options = RecipeOptions(tmp_path / "cache", Config(tmp_path / "cache"))
    assert options.migrate_keys(catalog.canonical_key) == 2
    on_disk = json.loads(path.read_text())
    assert on_disk == {f"builtin.{BUILTIN}": {"ctx_size": 1024}, "extra.gemma": {"ctx_size": 2048},
                       "Unknown-Model": {"ctx_size": 4096}, "user.Mine": {"ctx_size": 512},
                       BUILTIN3: {"ctx_size": 1}, f"builtin.{BUILTIN3}": {"ctx_size": 2}}
    assert options.saved(catalog.find(BUILTIN).name) == {"ctx_size": 1024}
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []  # written atomically
    assert options.migrate_keys(catalog.canonical_key) == 0  # a second start has nothing to do
    assert os.stat(path).st_size > 0
