"""Issue 30: the built-in catalog, entry by entry.

- Shape (no network, no server): every entry builds, names a recipe an engine serves, carries labels,
  size and `suggested` of the right types, checkpoints that parse, image defaults where they matter,
  and, for llama.cpp, an `architecture` the pinned llama.cpp loads (the set of those it cannot is
  spelled out, empty today).
- Upstream parity (when `LEMONADE_UPSTREAM_CATALOG` names upstream Lemonade's server_models.json):
  every entry of a recipe we serve is ours with the same checkpoints, labels, size and `suggested`.
- Names: every built-in name answers on the OpenAI (`/v1/models/{id}`, the official client), Ollama
  (`/api/show`, the official client, bare and `:latest`) and Lemonade (`/v1/models/{id}/options`,
  `/api/v1/models/{id}`) families as itself, against a real server with nothing downloaded.
- Refusals: a model whose architecture the pinned llama.cpp does not know is refused with a 400 naming
  it, from the catalog before any download and from the GGUF header at load, and no llama-server is
  started; a `system` llama-server is let through.
- A registry-backed collection (upstream's `RPG-HaloTales-*`) is pulled through its collection file
  on the local hub, registering the component the file defines.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from lemonade.backends.engine import EngineUnavailable
from lemonade.backends.llamacpp.arch import KNOWN
from lemonade.backends.llamacpp.engine import LlamaCppEngine
from lemonade.backends.registry import recipe_modes
from lemonade.catalog.catalog import Catalog, build_model
from lemonade.checkpoints.variants import is_exact_file_variant, match_variant, parse_checkpoint
from lemonade.config import Config
from lemonade.labels import COLLECTION_RECIPES
from lemonade.runtime.options import options_for
from tests.gguf_factory import write_gguf
from tests.helpers import TEST_CACHE
from tests.hub import fixtures as fx

ENTRIES: dict[str, dict[str, Any]] = json.loads(
    resources.files("lemonade.catalog").joinpath("resources/server_models.json").read_text())
SERVED_UPSTREAM = {"llamacpp", "sd-cpp", "whispercpp", "kokoro", "onnxruntime", "collection.omni", "vllm"}
# The labels of api-openai.md "Model Labels", plus upstream's informational `llamacpp` (the entry is a
# llama.cpp build's model) and `dflash` (its draft is a DFlash drafter).
LABELS = {"chat", "transcription", "embeddings", "reranking", "image", "tts", "audio-generation", "classification",
          "3d", "vision", "chat-transcription", "realtime-transcription", "mtp", "edit", "upscaling", "hot",
          "reasoning", "tool-calling", "coding", "experimental", "llamacpp", "dflash"}
# Catalog entries whose architecture the pinned llama.cpp (b11312) cannot load: listed, refused at load.
UNLOADABLE: set[str] = set()
MODE_LABEL = {"embeddings": "embeddings", "reranking": "reranking", "transcription": "transcription",
              "tts": "tts", "classification": "classification"}


# --- shape ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_shape(name: str) -> None:
    entry = ENTRIES[name]
    model = build_model("builtin." + name, entry, "builtin")  # the catalog's own checks
    assert name.strip() == name and "/" not in name and not name.endswith(":latest")
    assert not name.startswith(("user.", "extra.", "builtin."))
    recipe = entry["recipe"]
    assert recipe in recipe_modes() or recipe in COLLECTION_RECIPES, recipe
    assert isinstance(entry["labels"], list) and set(entry["labels"]) <= LABELS, entry["labels"]
    assert isinstance(entry["size"], (int, float)) and not isinstance(entry["size"], bool) and entry["size"] > 0
    assert isinstance(entry["suggested"], bool)
    assert entry.get("source", "huggingface") in ("huggingface", "modelscope")
    for label, mode in MODE_LABEL.items():
        if label in entry["labels"]:
            assert model.mode == mode, (label, model.mode)
    if model.is_collection:
        assert model.components or model.checkpoint, "a collection lists components or names its file's repository"
        for component in model.components or []:
            assert component in ENTRIES and ENTRIES[component]["recipe"] not in COLLECTION_RECIPES, component
        return
    assert "main" in model.checkpoints
    for role, checkpoint in model.checkpoints.items():
        ckpt = parse_checkpoint(checkpoint)
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", ckpt.repo), (role, checkpoint)
        if role != "main":
            assert ckpt.variant and is_exact_file_variant(ckpt.variant), (role, checkpoint)  # one named file
    if recipe == "llamacpp":
        architecture = entry["architecture"]
        assert (architecture in KNOWN) == (name not in UNLOADABLE), architecture
        for role in ("mmproj", "draft"):
            if role in model.checkpoints:
                assert model.checkpoints[role].lower().endswith(".gguf"), model.checkpoints[role]
    else:
        assert "architecture" not in entry
    if recipe == "sd-cpp" and "upscaling" not in entry["labels"]:
        defaults = entry["image_defaults"]
        assert {"steps", "cfg_scale", "width", "height"} <= set(defaults)
        assert all(isinstance(defaults[k], (int, float)) and defaults[k] > 0 for k in ("steps", "width", "height"))
    for key in entry.get("recipe_options", {}):
        assert key in options_for(recipe) or (recipe, key) == ("sd-cpp", "sdcpp_args"), key


def test_names_are_unique_without_case() -> None:
    """Built-in names resolve case-insensitively, so two may not differ by case alone."""
    lowered = [n.lower() for n in ENTRIES]
    assert len(set(lowered)) == len(lowered)


def test_catalog_loads_every_entry(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path)
    assert {m.public for m in catalog.all(rescan=False)} == set(ENTRIES)
    assert all(catalog.resolve(name.lower()).bare == name for name in ENTRIES)


@pytest.mark.skipif(not os.environ.get("LEMONADE_UPSTREAM_CATALOG"),
                    reason="LEMONADE_UPSTREAM_CATALOG=<upstream Lemonade's src/cpp/resources/server_models.json> "
                    "compares the catalog with it")
def test_upstream_entries_are_ours() -> None:
    upstream = json.loads(Path(os.environ["LEMONADE_UPSTREAM_CATALOG"]).read_text())
    served = {n: e for n, e in upstream.items() if e.get("recipe") in SERVED_UPSTREAM}
    missing = sorted(set(served) - set(ENTRIES))
    assert not missing, missing
    for name, theirs in served.items():
        ours = ENTRIES[name]
        for key in ("recipe", "checkpoint", "checkpoints", "mmproj", "labels", "size", "source", "image_defaults",
                    "hf_load"):
            assert ours.get(key) == theirs.get(key), (name, key)
        assert ours["suggested"] == theirs.get("suggested", False), name
        for key, value in theirs.get("recipe_options", {}).items():
            assert ours["recipe_options"][key] == value, (name, key)


def test_known_architectures_are_the_pinned_sources() -> None:
    """KNOWN is llama-arch.cpp's LLM_ARCH_NAMES of the pinned llama.cpp (minus `clip`)."""
    sources = sorted(TEST_CACHE.glob("backends/llamacpp/_src/llama.cpp-*/src/llama-arch.cpp"))
    if not sources:
        pytest.skip(f"no extracted llama.cpp sources in {TEST_CACHE} (a llamacpp:cpu source build leaves them)")
    text = sources[-1].read_text()
    table = text[text.index("LLM_ARCH_NAMES"):text.index("};", text.index("LLM_ARCH_NAMES"))]
    names = set(re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([^"]+)"\s*\}', table)) - {"clip", "(unknown)"}
    assert names == set(KNOWN)


def test_whole_repository_and_wildcard_checkpoints() -> None:
    """`owner/repo` is the whole repository with its model GGUF first; `owner/repo:*` every GGUF (a shard set)."""
    files = [".gitattributes", "README.md", "gpt-oss-20b-mxfp4.gguf", "mmproj-x.gguf"]
    assert match_variant(files, None)[0] == "gpt-oss-20b-mxfp4.gguf"
    shards = ["README.md", "gpt-oss-120b-mxfp4-00002-of-00003.gguf", "gpt-oss-120b-mxfp4-00001-of-00003.gguf",
              "gpt-oss-120b-mxfp4-00003-of-00003.gguf"]
    assert match_variant(shards, "*") == sorted(shards[1:])


# --- architecture refusals (the engine's own checks) -------------------------------------------------------


def test_catalog_architecture_is_refused_before_any_download(tmp_path: Path) -> None:
    engine = LlamaCppEngine(tmp_path, Config(tmp_path, environ={}))
    future = build_model("builtin.Future-GGUF", {"checkpoint": "example/future-GGUF:Q4_K_M", "recipe": "llamacpp",
                                                 "architecture": "future-arch", "labels": ["chat"], "size": 1.0},
                         "builtin")
    with pytest.raises(EngineUnavailable) as err:
        engine.check_model(future, "cpu")
    assert err.value.code == "unsupported_model_architecture"
    assert "'future-arch'" in str(err.value) and "llamacpp_backend=system" in str(err.value)
    engine.check_model(future, "system")  # a llama-server of the user's may be newer: tried
    for name, entry in ENTRIES.items():
        if entry["recipe"] == "llamacpp" and name not in UNLOADABLE:
            engine.check_model(build_model("builtin." + name, entry, "builtin"), "cpu")


# --- a real server: names on every API family, refusals, a registry-backed collection -------------------------


@pytest.fixture(scope="module")
def extra_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extra")
    write_gguf(root / "future" / "future-Q4_K_M.gguf", "future-arch", context_length=2048)
    return root


@pytest.fixture(scope="module")
def server(module_servers, extra_dir):
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra_dir)})


def test_every_name_round_trips_through_every_api(server) -> None:
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    oll = ollama.Client(host=server.url)
    with server.client() as http:
        default = {m["id"] for m in http.get("/v1/models", params={"show_all": True}).json()["data"]}
        # Every entry, also those bigger than this machine, which the shipped default hides (catalog/fit.py)
        assert http.post("/internal/set", json={"disable_model_filtering": True}).status_code == 200
        listed = {m["id"]: m for m in http.get("/v1/models", params={"show_all": True}).json()["data"]}
        assert set(ENTRIES) <= set(listed) and default < set(listed)
        for name in ENTRIES:
            assert oai.models.retrieve(name).id == name
            assert http.get(f"/api/v1/models/{name}").json()["id"] == name
            options = http.get(f"/v1/models/{name}/options")
            if ENTRIES[name]["recipe"] in COLLECTION_RECIPES:  # options belong to its components
                assert options.status_code == 400 and f"Model {name} is a collection" in options.text
            else:
                assert options.status_code == 200 and options.json()["model_name"] == name, options.text
            for asked in (name, f"{name}:latest"):
                shown = oll.show(asked)
                assert shown.details is not None and shown.modelfile, asked
                assert shown.details.family == ENTRIES[name].get("architecture", ENTRIES[name]["recipe"])
            entry, obj = ENTRIES[name], listed[name]
            assert obj["owned_by"] == "lemonade" and obj["recipe"] == entry["recipe"]
            assert obj["labels"] == entry["labels"] and obj["size"] == entry["size"] and obj["downloaded"] is False
            if entry["recipe"] in COLLECTION_RECIPES:
                assert obj["checkpoint"] == entry.get("checkpoint", "")
                assert [m["id"] for m in obj["models"]] == obj["components"] == entry.get("components", [])
            else:
                assert obj["checkpoint"] == (entry.get("checkpoint") or entry["checkpoints"]["main"])
        assert http.get("/v1/models/Gemma-4-E2B-it-GGUF").json()["checkpoint"] == "unsloth/gemma-4-E2B-it-GGUF:Q4_K_M"


def test_unknown_gguf_architecture_is_refused_at_load(server) -> None:
    with server.client() as http:
        resp = http.post("/v1/load", json={"model_name": "future", "llamacpp_backend": "cpu"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "unsupported_model_architecture"
        assert "'future-arch'" in error["message"] and "future-Q4_K_M.gguf" in error["message"]
        chat = http.post("/v1/chat/completions",
                         json={"model": "future", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "future-arch" in chat.text
    assert server.engine_pids() == []  # llama-server was never started on it


def test_registry_backed_collection_is_pulled_through_its_file(hub, make_server) -> None:
    """`RPG-HaloTales-V1` names `lemonade-sdk/RPG-HaloTales-V1`; the local hub holds a collection file
    there (ours: one tiny component defined inline), so a pull registers and downloads it."""
    repo = "lemonade-sdk/RPG-HaloTales-V1"
    collection = {"model_name": "user.RPG-HaloTales-V1", "recipe": "collection.omni", "components": ["Tiny-Narrator"],
                  "models": [{"model_name": "Tiny-Narrator", "recipe": "llamacpp", "labels": ["chat"], "size": 0.001,
                              "checkpoints": {"main": f"{fx.MULTIQUANT_REPO}:Q4_0"}}]}
    hub.create_repo(repo, {"RPG-HaloTales-V1.json": json.dumps(collection).encode()})
    srv = make_server(env=hub.env())
    with srv.client() as http:
        before = http.get("/v1/models/RPG-HaloTales-V1").json()
        assert before["checkpoint"] == repo and before["components"] == [] and before["downloaded"] is False
        resp = http.post("/v1/pull", json={"model_name": "RPG-HaloTales-V1"}, timeout=120)
        assert resp.status_code == 200, resp.text
        after = http.get("/v1/models/RPG-HaloTales-V1").json()
        assert after["components"] == ["Tiny-Narrator"] and after["downloaded"] is True  # a user.* model now
        assert [m["id"] for m in after["models"]] == ["Tiny-Narrator"] and after["models"][0]["downloaded"]
        assert http.get("/v1/models/user.Tiny-Narrator").json()["checkpoint"] == f"{fx.MULTIQUANT_REPO}:Q4_0"
    srv.stop()
    again = make_server(env=hub.env(), cache=srv.cache)  # the pulled file is read at start
    with again.client() as http:
        assert http.get("/v1/models/RPG-HaloTales-V1").json()["components"] == ["Tiny-Narrator"]


def test_registered_pointer_collection_follows_its_file(hub, make_server) -> None:
    """`lemonade pull <org>/<repo>` registers a collection as a pointer to a repository holding its
    collection file: only the pointer is stored, the components are what the file lists at each pull
    (an added component appears on the next pull), the copy pulled before serves while the registry
    cannot be reached, and a restarted server reads the pulled file."""
    repo = "acme/StoryKit"

    def manifest(*components: str) -> str:
        models = [{"model_name": c, "recipe": "llamacpp", "checkpoints": {"main": f"{fx.MULTIQUANT_REPO}:Q4_0"}}
                  for c in components]
        return json.dumps({"model_name": "StoryKit", "recipe": "collection.omni", "checkpoints": {"main": ""},
                           "components": list(components), "models": models})

    hub.create_repo(repo, {"StoryKit.json": manifest("Kit-Narrator")})
    srv = make_server(env=hub.env())
    pointer = {"model_name": "user.StoryKit", "recipe": "collection.omni", "checkpoints": {"main": repo}}
    with srv.client() as http:
        resp = http.post("/v1/pull", json=pointer, timeout=120)
        assert resp.status_code == 200, resp.text
        obj = http.get("/v1/models/user.StoryKit").json()
        assert obj["components"] == ["Kit-Narrator"] and obj["downloaded"] is True
        stored = json.loads((srv.config_dir / "user_models.json").read_text())["StoryKit"]
        assert stored["checkpoints"] == {"main": repo} and "components" not in stored and "models" not in stored

        hub.write_file(repo, "StoryKit.json", manifest("Kit-Narrator", "Kit-Voice"))
        assert http.post("/v1/pull", json={"model_name": "user.StoryKit"}, timeout=120).status_code == 200
        assert http.get("/v1/models/user.StoryKit").json()["components"] == ["Kit-Narrator", "Kit-Voice"]

        hub.fail(path=repo, status=503, count=None)  # the registry is down for this repository
        resp = http.post("/v1/pull", json={"model_name": "user.StoryKit"}, timeout=120)
        assert resp.status_code == 200, resp.text
        assert "could not be fetched again" in srv.log()
    hub.reset()
    srv.stop()
    again = make_server(env=hub.env(), cache=srv.cache)
    with again.client() as http:
        assert http.get("/v1/models/user.StoryKit").json()["components"] == ["Kit-Narrator", "Kit-Voice"]


def test_cli_pulls_a_collection_shared_on_a_registry(hub, make_server) -> None:
    """`lemonade pull acme/PocketKit` (guide-configuration-custom-models.md, "Share a collection"): the
    repository holds `PocketKit.json`, so `/v1/pull/variants` calls it a collection and the CLI pulls it
    as `user.PocketKit`, a pointer to the repository; the server fetches the file, then the component
    it defines (the real Gemma), and the collection answers a chat. A same-named file that is not a
    collection file is refused naming it; a GGUF repository is still one."""
    from tests.helpers import run_cli

    repo = "acme/PocketKit"
    llm = {"model_name": "Pocket-LLM", "recipe": "llamacpp", "labels": ["chat"],
           "checkpoints": {"main": f"{fx.GEMMA_REPO}:Q4_K_M"}}
    kit = {"model_name": "PocketKit", "recipe": "collection.omni", "checkpoints": {"main": ""}, "size": 0.25,
           "components": ["Pocket-LLM"], "models": [llm]}
    hub.create_repo(repo, {"PocketKit.json": json.dumps(kit).encode(), "README.md": b"# a shared collection\n"})
    hub.create_repo("acme/NotAKit", {"NotAKit.json": b'{"hello": "world"}'})
    srv = make_server(env=hub.env())
    with srv.client() as http:
        described = http.get("/v1/pull/variants", params={"checkpoint": repo}).json()
        assert described == {"checkpoint": repo, "source": "huggingface", "recipe": "collection.omni",
                             "repo_kind": "collection", "suggested_name": "PocketKit", "suggested_labels": [],
                             "mmproj_files": [], "variants": [], "component_count": 1, "size": 0.25}
        assert not list(srv.cache.rglob("models--acme--PocketKit"))  # inspected, not downloaded
        bad = http.get("/v1/pull/variants", params={"checkpoint": "acme/NotAKit"})
        assert bad.status_code == 400 and "NotAKit.json" in bad.json()["error"] and "'recipe'" in bad.json()["error"]
        gguf = http.get("/v1/pull/variants", params={"checkpoint": fx.MULTIQUANT_REPO}).json()
        assert gguf["repo_kind"] == "gguf" and gguf["variants"]
    pulled = run_cli(srv, "pull", repo, "--variant", "Q4_0")
    said = " ".join(pulled.stdout.split())
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "Pulling collection acme/PocketKit as user.PocketKit (1 component, ~0.25 GB)" in said
    assert "Installed model: user.PocketKit" in said and "--variant Q4_0 is ignored" in pulled.stderr
    with srv.client() as http:
        obj = http.get("/v1/models/user.PocketKit").json()
        assert obj["components"] == ["Pocket-LLM"] and obj["downloaded"] is True and obj["checkpoint"] == repo
        stored = json.loads((srv.config_dir / "user_models.json").read_text())["PocketKit"]
        assert stored["checkpoints"] == {"main": repo} and stored["recipe"] == "collection.omni"
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model="PocketKit", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Say hi."}])
    assert "user.PocketKit".endswith(reply.model) and reply.choices[0].finish_reason in ("stop", "length")


def test_readme_models_pull_from_their_repositories(hub, make_server, tmp_path) -> None:
    """`lemonade pull Gemma-4-E2B-it-GGUF` (upstream's README model) and `Qwen3.5-4B-GGUF` fetch what
    their entries name from repositories laid out as upstream's (tiny random GGUFs under the real file
    names, beside other quantizations that must not be fetched), model and projector."""
    layouts = {
        "Gemma-4-E2B-it-GGUF": ("unsloth/gemma-4-E2B-it-GGUF", "gemma-4-E2B-it-Q4_K_M.gguf",
                                ["gemma-4-E2B-it-UD-Q4_K_XL.gguf", "gemma-4-E2B-it-Q8_0.gguf"]),
        "Qwen3.5-4B-GGUF": ("unsloth/Qwen3.5-4B-GGUF", "Qwen3.5-4B-UD-Q4_K_XL.gguf", ["Qwen3.5-4B-Q4_K_M.gguf"]),
    }
    for name, (repo, wanted, others) in layouts.items():
        files: dict[str, Path] = {}
        for file in (wanted, "mmproj-F16.gguf", *others):
            [files[file]] = fx.write_tiny_gguf(tmp_path / repo / file, arch=ENTRIES[name]["architecture"], name=file)
        hub.create_repo(repo, {**files, "README.md": b"# test layout\n"})
    srv = make_server(env=hub.env())
    with srv.client() as http:
        for name, (repo, wanted, _others) in layouts.items():
            resp = http.post("/v1/pull", json={"model_name": name}, timeout=120)
            assert resp.status_code == 200, resp.text
            assert http.get(f"/v1/models/{name}").json()["downloaded"] is True
            fetched = {e["file"] for e in hub.downloads(repo=repo) if e["status"] in (200, 206)}
            assert fetched == {wanted, "mmproj-F16.gguf"}, fetched
