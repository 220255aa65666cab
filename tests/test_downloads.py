"""Model downloads against the local hub: pull modes, variants, search, files, delete, updates, CLI.

The server is the real one (subprocess) with `HF_ENDPOINT`/`MODELSCOPE_ENDPOINT` pointing at the
local hub (tests/hub), so huggingface_hub and the ModelScope HTTP client are the real clients.
The tiny multi-quant GGUFs have random weights: only code paths matter for them (they are never
loaded); real inference on a downloaded model is in test_downloads_resilience.py (Gemma).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import error_of, fetched, model, repo_dir, run_cli, served_folder, sse_events
from tests.hub import fixtures as fx

MQ = fx.MULTIQUANT_REPO


@pytest.fixture(scope="module")
def server(module_servers, hub_server, tmp_path_factory):
    extra = tmp_path_factory.mktemp("extra-models")
    (extra / "my-local.gguf").write_bytes(fx.default_root().joinpath(MQ, "tiny-Q4_0.gguf").read_bytes())
    return module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(extra)})


@pytest.fixture
def client(server, hub):
    with server.client() as c:
        yield c


# ----- pull: the three response modes ---------------------------------------------------------------

def test_pull_plain_json_registers_and_installs(client, hub, server):
    resp = client.post("/v1/pull", json={"model_name": "user.tiny-q4", "checkpoint": f"{MQ}:Q4_K_M",
                                         "recipe": "llamacpp"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "success"
    assert resp.json()["message"] == "Installed model: user.tiny-q4"
    obj = model(client, "user.tiny-q4")
    assert obj["downloaded"] is True and obj["checkpoint"] == f"{MQ}:Q4_K_M" and obj["recipe"] == "llamacpp"
    [get] = fetched(hub, file="tiny-Q4_K_M.gguf")
    assert get["bytes_sent"] == hub.file_path(MQ, "tiny-Q4_K_M.gguf").stat().st_size
    assert get["authorization"] is False  # no HF_TOKEN in the server's environment
    commit = hub.commit(MQ)
    snap = repo_dir(server, MQ) / "snapshots" / commit / "tiny-Q4_K_M.gguf"
    assert snap.is_symlink() and snap.read_bytes() == hub.file_path(MQ, "tiny-Q4_K_M.gguf").read_bytes()
    assert (repo_dir(server, MQ) / "refs" / "main").read_text() == commit
    assert not list((repo_dir(server, MQ) / "blobs").glob("*.incomplete"))

    # Pulling again checks the registry but fetches nothing.
    hub.clear_requests()
    assert client.post("/v1/pull", json={"model_name": "user.tiny-q4"}).status_code == 200
    assert hub.downloads() == []
    # do_not_upgrade skips the registry entirely
    hub.clear_requests()
    assert client.post("/v1/pull", json={"model": "user.tiny-q4", "do_not_upgrade": True}).status_code == 200
    assert hub.requests() == []


def test_pull_sse_sharded_folder_variant_with_mmproj(client, hub):
    events = sse_events(client, {"model_name": "user.tiny-q8", "checkpoint": f"{MQ}:Q8_0",
                                 "mmproj": fx.MMPROJ_FILE, "recipe": "llamacpp", "vision": True})
    names = [e for e, _ in events]
    assert names[-1] == "complete" and set(names[:-1]) == {"progress"}
    progress = [d for e, d in events if e == "progress"]
    for data in progress:
        assert {"file", "file_index", "total_files", "bytes_downloaded", "bytes_total", "percent"} <= set(data)
        assert data["total_files"] == 3
    files = [*fx.MULTIQUANT_SHARDED["Q8_0"], fx.MMPROJ_FILE]
    sizes = {f: hub.file_path(MQ, f).stat().st_size for f in files}
    finals = {d["file"]: d for d in progress if d["percent"] == 100}
    assert set(finals) == set(files)
    assert [finals[f]["file_index"] for f in files] == [1, 2, 3]
    assert all(finals[f]["bytes_downloaded"] == finals[f]["bytes_total"] == sizes[f] for f in files)
    assert progress[0]["total_download_size"] == sum(sizes.values())
    assert events[-1][1] == {"file_index": 3, "total_files": 3, "percent": 100}
    obj = model(client, "user.tiny-q8")
    assert obj["downloaded"] and "vision" in obj["labels"]
    assert obj["checkpoints"] == {"main": f"{MQ}:Q8_0", "mmproj": f"{MQ}:{fx.MMPROJ_FILE}"}
    files_resp = client.get("/v1/models/user.tiny-q8/files").json()
    assert [(f["name"], f["role"], f["size_bytes"], f["exists"]) for f in files_resp["files"]] == [
        ("tiny-Q8_0-00001-of-00002.gguf", "main", sizes[files[0]], True),
        ("tiny-Q8_0-00002-of-00002.gguf", "shard", sizes[files[1]], True),
        (fx.MMPROJ_FILE, "mmproj", sizes[files[2]], True)]
    assert all("path" not in f for f in files_resp["files"])
    with_paths = client.get("/v1/models/user.tiny-q8/files", params={"include_paths": "true"}).json()
    assert all(Path(f["path"]).is_absolute() and Path(f["path"]).exists() for f in with_paths["files"])


def test_pull_exact_file_checkpoints_dict_and_legacy_flags(client, hub):
    resp = client.post("/v1/pull", json={
        "model_name": "user.tiny-f16", "recipe": "llamacpp",
        "checkpoints": {"main": f"{MQ}:tiny-F16.gguf", "mmproj": f"{MQ}:{fx.MMPROJ_FILE}"}, "reasoning": True})
    assert resp.status_code == 200, resp.text
    obj = model(client, "user.tiny-f16")
    assert obj["downloaded"] and obj["labels"] == ["custom", "reasoning", "chat"]
    emb = client.post("/v1/pull", json={"model_name": "user.tiny-emb", "recipe": "llamacpp", "embedding": True,
                                        "checkpoint": f"{fx.EMBEDDING_REPO}:F16"})
    assert emb.status_code == 200, emb.text
    assert model(client, "user.tiny-emb")["labels"] == ["custom", "embeddings"]
    # a checkpoint given as a Hugging Face URL is normalised
    url = client.post("/v1/pull", json={"model_name": "user.tiny-url", "recipe": "llamacpp",
                                        "checkpoint": f"https://huggingface.co/{fx.RERANKER_REPO}"})
    assert url.status_code == 200, url.text
    assert model(client, "user.tiny-url")["checkpoint"] == fx.RERANKER_REPO


def test_pull_from_modelscope(client, hub, server):
    resp = client.post("/v1/pull", json={"model_name": "user.ms-tiny", "recipe": "llamacpp", "source": "modelscope",
                                         "checkpoint": f"{MQ}:Q4_0"})
    assert resp.status_code == 200, resp.text
    obj = model(client, "user.ms-tiny")
    assert obj["downloaded"] and obj["source"] == "modelscope"
    kinds = {e["kind"] for e in hub.requests()}
    assert "ms-files" in kinds and "api-info" not in kinds  # the ModelScope API, not Hugging Face's
    assert [e["file"] for e in fetched(hub)] == ["tiny-Q4_0.gguf"]
    folder = repo_dir(server, MQ, "modelscope")
    [snap] = list((folder / "snapshots").iterdir())
    assert (snap / "tiny-Q4_0.gguf").read_bytes() == hub.file_path(MQ, "tiny-Q4_0.gguf").read_bytes()
    # registry_source is an accepted spelling; disagreeing spellings are refused
    bad = client.post("/v1/pull", json={"model_name": "user.ms-x", "recipe": "llamacpp", "source": "hf",
                                        "registry_source": "ms", "checkpoint": f"{MQ}:Q4_0"})
    assert bad.status_code == 400 and "registry_source" in error_of(bad)["message"]


def test_pull_4xx(client, hub):
    def post(body: Any) -> httpx.Response:
        return client.post("/v1/pull", json=body) if not isinstance(body, str) else client.post(
            "/v1/pull", content=body, headers={"content-type": "application/json"})

    cases: list[tuple[Any, int, str]] = [
        ({}, 400, "model_name"),
        ({"model_name": 5}, 400, "model_name"),
        ({"model_name": "user.x", "stream": "yes"}, 400, "stream"),
        ({"model_name": "user.x", "subscribe": 1, "stream": True}, 400, "subscribe"),
        ({"model_name": "No-Such-Model"}, 404, "No-Such-Model"),
        ({"model_name": "Tiny", "checkpoint": f"{MQ}:Q4_0", "recipe": "llamacpp"}, 400, "user."),
        ({"model_name": "extra.Tiny", "checkpoint": f"{MQ}:Q4_0", "recipe": "llamacpp"}, 400, "reserved"),
        ({"model_name": "user.Clf", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q4_0", "labels": ["classification"]},
         400, "Model 'user.Clf': recipe 'llamacpp' cannot serve 'classification'. It serves 'chat', 'embeddings', "
              "'reranking'. Omit the label to deploy as 'chat'."),
        ({"model_name": "user.Both", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q4_0",
          "labels": ["chat", "embeddings"]},
         400, "Model 'user.Both': a model deploys in exactly one mode, but these labels name two: 'chat' and "
              "'embeddings'. Register one model per mode."),
        ({"model_name": "user.NoCkpt", "recipe": "llamacpp", "labels": []}, 400, "checkpoint"),
        ({"model_name": "user.Bad", "recipe": "llamacpp", "checkpoint": "no-slash"}, 400, "owner/repo"),
        ({"model_name": "user.Bad", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q4_0", "source": "github"}, 400,
         "source"),
        ({"model_name": "user.Gone", "recipe": "llamacpp", "checkpoint": "test-org/no-such-repo:Q4_0"}, 404,
         "test-org/no-such-repo"),
        ({"model_name": "user.NoQuant", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q9_9"}, 404,
         "Available variants: Q4_K_M, UD-Q4_K_XL, Q8_0, Q4_0"),
        ({"model_name": "user.NoFile", "recipe": "llamacpp", "checkpoint": f"{MQ}:missing.gguf"}, 404,
         "missing.gguf"),
        ({"model_name": "user.Self", "recipe": "collection.omni", "components": ["user.Self"]}, 400, "itself"),
        ({"model_name": "user.Empty", "recipe": "collection.omni", "components": []}, 400, "components"),
        ({"model_name": "user.Lost", "recipe": "collection.omni", "components": ["user.nowhere"]}, 400,
         "user.nowhere"),
        ("{not json", 400, "JSON"),
        ("[1, 2]", 400, "JSON object"),
    ]
    for body, status, needle in cases:
        resp = post(body)
        assert resp.status_code == status, (body, resp.text)
        assert needle in error_of(resp)["message"], (body, resp.text)
        # api-lemonade.md: a refused definition is {"error": "<message>"}; other errors keep the object
        refused = isinstance(body, dict) and "recipe" in body and status == 400
        assert isinstance(resp.json()["error"], str) == refused, (body, resp.text)
    # Refused definitions are never registered.
    for name in ("user.Clf", "user.Both", "user.Gone", "user.NoQuant", "user.Self", "user.Lost"):
        assert client.get(f"/v1/models/{name}").status_code == 404
    # A built-in model whose repository the registry does not have: 404 naming it.
    resp = client.post("/v1/pull", json={"model_name": "Qwen3-0.6B-GGUF"})
    assert resp.status_code == 404 and "unsloth/Qwen3-0.6B-GGUF" in error_of(resp)["message"]
    # In SSE mode an error before any progress keeps its HTTP status too.
    resp = client.post("/v1/pull", json={"model_name": "Qwen3-0.6B-GGUF", "stream": True})
    assert resp.status_code == 404
    # ... and a failure after the stream started is an `error` event.
    hub.fail(path="tiny-Q5_K_M.gguf", status=500, count=None, method="GET")
    events = sse_events(client, {"model_name": "user.tiny-q5", "checkpoint": f"{MQ}:Q5_K_M", "recipe": "llamacpp"})
    assert events[-1][0] == "error" and "500" in events[-1][1]["error"]
    assert model(client, "user.tiny-q5")["downloaded"] is False
    # A collection whose components must nest is refused.
    nested = client.post("/v1/pull", json={"model_name": "user.Outer", "recipe": "collection.omni",
                                           "components": ["user.Inner"],
                                           "models": [{"model_name": "user.Inner", "recipe": "collection.omni",
                                                       "components": ["user.tiny-q4"]}]})
    assert nested.status_code == 400 and "nested" in error_of(nested)["message"]


# ----- collections, export and import ---------------------------------------------------------------

@pytest.fixture
def recipes_site(tmp_path):
    """A copy of lemonade-sdk/recipes served over HTTP as raw.githubusercontent.com serves it."""
    root = tmp_path / "recipes"
    (root / "coding-agents").mkdir(parents=True)
    (root / "coding-agents" / "Tiny-Q4_0.json").write_text(json.dumps(
        {"model_name": "tiny-recipe", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q4_0", "labels": ["coding"]}))
    with served_folder(root) as url:
        yield url


def test_import_rules_and_remote_recipes(client, server, tmp_path, recipes_site):
    """guide-cli.md, "Options for import": `id` for `model_name`, `user.` added, `checkpoints` wins
    over `checkpoint`, unknown fields dropped and named; remote recipes by --directory/--recipe-file
    non-interactively; the usage rules refused with exit 2 before anything happens."""
    path = tmp_path / "hand-written.json"
    path.write_text(json.dumps({"id": "imp-q4", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q9_9",
                                "checkpoints": {"main": f"{MQ}:Q4_0"}, "labels": ["coding"], "colour": "green"}))
    out = run_cli(server, "import", str(path))
    assert out.returncode == 0, out.stderr
    assert "Ignoring unrecognized field(s)" in out.stderr and "colour" in out.stderr
    imported = model(client, "user.imp-q4")
    assert imported["checkpoint"] == f"{MQ}:Q4_0" and imported["downloaded"]
    assert imported["labels"] == ["custom", "coding", "chat"]  # `custom` and the deployment label added

    recipes = {"LEMONADE_RECIPES_URL": recipes_site}
    out = run_cli(server, "import", "--directory", "coding-agents", "--recipe-file", "Tiny-Q4_0.json", "--yes",
                  **recipes)
    assert out.returncode == 0, out.stderr
    assert model(client, "user.tiny-recipe")["downloaded"]
    out = run_cli(server, "import", "--directory", "coding-agents", "--recipe-file", "Nope.json", "--yes", **recipes)
    assert out.returncode == 1 and "does not exist" in out.stderr and "Nope.json" in out.stderr

    usage = [(["import", "--yes"], "needs both"), (["import", "--directory", "coding-agents", "--yes"], "needs both"),
             (["import", "--recipe-file", "x.json"], "give --directory too"),
             (["import", str(path), "--directory", "coding-agents"], "not both"),
             (["import"], "needs both")]  # no terminal to browse in: as non-interactive
    for args, needle in usage:
        out = run_cli(server, *args, input_text="", **recipes)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
    for broken, needle in [({"recipe": "llamacpp", "checkpoint": f"{MQ}:Q4_0"}, "'model_name' (or 'id')"),
                           ({"model_name": "x", "checkpoint": f"{MQ}:Q4_0"}, "'recipe' is required"),
                           ({"model_name": "x", "recipe": "llamacpp"}, "'checkpoint'"),
                           ([1, 2], "JSON object")]:
        path.write_text(json.dumps(broken))
        out = run_cli(server, "import", str(path))
        assert out.returncode == 1 and needle in out.stderr, (broken, out.stderr)
    assert client.get("/v1/models/user.x").status_code == 404


def test_collection_pull_export_import(client, hub, server, tmp_path):
    body = {"model_name": "user.Kit", "recipe": "collection.omni", "components": ["user.kit-q4", "user.kit-q6"],
            "models": [
                {"model_name": "user.kit-q4", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q5_K_M",
                 "recipe_options": {"ctx_size": 1024}},
                {"model_name": "user.kit-q6", "recipe": "llamacpp", "checkpoint": f"{MQ}:Q6_K", "labels": ["coding"]},
            ]}
    events = sse_events(client, body)
    assert events[-1][0] == "complete"
    kit = model(client, "user.Kit")
    # Components are listed by public id, the namespace of `id` (registered models shadowing nothing show bare).
    assert kit["downloaded"] and kit["components"] == ["kit-q4", "kit-q6"]
    assert model(client, "user.kit-q6")["labels"] == ["custom", "coding", "chat"]
    assert client.get("/v1/models/user.kit-q4/options").json()["saved"] == {"ctx_size": 1024}

    out = run_cli(server, "export", "user.Kit", "-o", str(tmp_path / "kit.json"))
    assert out.returncode == 0, out.stderr
    exported = json.loads((tmp_path / "kit.json").read_text())
    assert exported["model_name"] == "user.Kit" and exported["recipe"] == "collection.omni"
    assert exported["components"] == ["kit-q4", "kit-q6"]  # imported again, each registers as user.<name>
    assert [m["model_name"] for m in exported["models"]] == ["kit-q4", "kit-q6"]
    assert exported["models"][0]["checkpoints"] == {"main": f"{MQ}:Q5_K_M"}
    assert exported["models"][0]["recipe_options"] == {"ctx_size": 1024}
    for forbidden in ("suggested", "created", "downloaded", "id", "object"):
        assert forbidden not in exported and all(forbidden not in m for m in exported["models"])

    # Deleting a collection removes only its entry; the components stay on disk.
    assert client.post("/v1/delete", json={"model_name": "user.Kit"}).status_code == 200
    assert client.get("/v1/models/user.Kit").status_code == 404
    assert model(client, "user.kit-q4")["downloaded"]
    for name in ("user.kit-q4", "user.kit-q6"):
        assert client.post("/v1/delete", json={"model_name": name}).status_code == 200
        assert client.get(f"/v1/models/{name}").status_code == 404

    # `lemonade import` of the file re-creates everything, options included.
    out = run_cli(server, "import", str(tmp_path / "kit.json"))
    assert out.returncode == 0, out.stderr
    assert "Installed model: user.Kit" in out.stdout
    assert model(client, "user.Kit")["downloaded"] and model(client, "user.kit-q6")["downloaded"]
    assert client.get("/v1/models/user.kit-q4/options").json()["saved"] == {"ctx_size": 1024}

    # A regular model's export, posted verbatim to /v1/pull, re-creates it too.
    out = run_cli(server, "export", "user.kit-q6", "-o", "-")
    assert out.returncode == 0, out.stderr
    single = json.loads(out.stdout)
    assert single == {"model_name": "user.kit-q6", "recipe": "llamacpp", "checkpoints": {"main": f"{MQ}:Q6_K"},
                      "labels": ["custom", "coding", "chat"],  # as registered: custom and the deployment label added
                      "recipe_options": {}, "registry_source": "huggingface"}
    assert client.post("/v1/delete", json={"model_name": "user.kit-q6"}).status_code == 200
    resp = client.post("/v1/pull", json=single)
    assert resp.status_code == 200, resp.text
    assert model(client, "user.kit-q6")["downloaded"]


# ----- variants -------------------------------------------------------------------------------------

def test_pull_variants(client, hub):
    resp = client.get("/v1/pull/variants", params={"checkpoint": MQ})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["checkpoint"] == MQ and body["recipe"] == "llamacpp"
    assert body["suggested_name"] == "tiny-multiquant-GGUF"
    assert body["suggested_labels"] == ["vision"] and body["mmproj_files"] == [fx.MMPROJ_FILE]
    assert [v["name"] for v in body["variants"]] == ["Q4_K_M", "UD-Q4_K_XL", "Q8_0", "Q4_0", "F16"]
    size = {f: hub.file_path(MQ, f).stat().st_size for f in [*fx.MULTIQUANT_SINGLE.values(),
                                                              *fx.MULTIQUANT_SHARDED["Q8_0"]]}
    for v in body["variants"]:
        assert v["size_bytes"] == sum(size[f] for f in v["files"]) and v["primary_file"] == v["files"][0]
        assert v["sharded"] == (v["name"] == "Q8_0")
    q8 = body["variants"][2]
    assert q8["files"] == list(fx.MULTIQUANT_SHARDED["Q8_0"])
    labels = {repo: client.get("/v1/pull/variants", params={"checkpoint": repo}).json()["suggested_labels"]
              for repo in (fx.EMBEDDING_REPO, fx.RERANKER_REPO)}
    assert labels == {fx.EMBEDDING_REPO: ["embeddings"], fx.RERANKER_REPO: ["reranking"]}
    sharded = client.get("/v1/pull/variants", params={"checkpoint": fx.SHARDED_REPO}).json()["variants"]
    assert sharded == [{"name": "Q4_K_M", "primary_file": fx.SHARDED_FILES[0], "files": list(fx.SHARDED_FILES),
                        "sharded": True, "size_bytes": sum(hub.file_path(fx.SHARDED_REPO, f).stat().st_size
                                                            for f in fx.SHARDED_FILES)}]
    assert client.get("/v1/pull/variants", params={"checkpoint": fx.SAFETENSORS_REPO}).json()["variants"] == []
    ms = client.get("/v1/pull/variants", params={"checkpoint": MQ, "source": "modelscope"}).json()
    assert ms["source"] == "modelscope" and [v["name"] for v in ms["variants"]][:3] == ["Q4_K_M", "UD-Q4_K_XL",
                                                                                         "Q8_0"]
    # errors
    assert client.get("/v1/pull/variants").status_code == 400
    assert client.get("/v1/pull/variants", params={"checkpoint": "  "}).status_code == 400
    bad = client.get("/v1/pull/variants", params={"checkpoint": "no-slash"})
    assert bad.status_code == 400 and "owner/repo" in error_of(bad)["message"]
    assert client.get("/v1/pull/variants", params={"checkpoint": MQ, "source": "x"}).status_code == 400
    missing = client.get("/v1/pull/variants", params={"checkpoint": "test-org/nothing-here"})
    assert missing.status_code == 404  # as Lemonade's words it: a bare string naming the checkpoint
    assert missing.json()["error"].startswith("Checkpoint 'test-org/nothing-here' not found on Hugging Face")
    ms_missing = client.get("/v1/pull/variants", params={"checkpoint": "test-org/nothing-here", "source": "modelscope"})
    assert ms_missing.status_code == 404 and error_of(ms_missing)["message"] == ("Checkpoint 'test-org/nothing-here' "
                                                                                 "not found on ModelScope")
    hub.fail(path=f"/api/models/{MQ}", status=503, count=1)
    down = client.get("/v1/pull/variants", params={"checkpoint": MQ})  # the registry's failure: a 502, not ours
    assert down.status_code == 502 and error_of(down)["upstream_status"] == 503, down.text
    conflict = client.get("/v1/pull/variants", params={"checkpoint": f"https://huggingface.co/{MQ}",
                                                        "source": "modelscope"})
    assert conflict.status_code == 400
    assert "URL uses huggingface, but source was set to" in error_of(conflict)["message"]


def test_variants_forward_hf_token(make_server, hub):
    srv = make_server(env={**hub.env(), "HF_TOKEN": "hf_test_token"})
    with srv.client() as c:
        assert c.get("/v1/pull/variants", params={"checkpoint": MQ}).status_code == 200
    [info] = hub.requests(kind="api-info")
    assert info["authorization"] is True


# ----- registry search ------------------------------------------------------------------------------

def test_registry_search_huggingface(client, hub):
    resp = client.get("/v1/registry/search", params={"query": "  gemma ", "format": "gguf"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["source"] == "huggingface" and body["query"] == "gemma" and body["format"] == "gguf"
    ids = [r["repository_id"] for r in body["results"]]
    assert ids == [fx.GEMMA_REPO, fx.SHARDED_REPO] and body["total"] >= 2
    first = body["results"][0]
    assert first == {"repository_id": fx.GEMMA_REPO, "display_name": "gemma-3-270m-GGUF", "source": "huggingface",
                     "repository_type": "model", "description": "", "tags": first["tags"],
                     "task": "text-generation", "downloads": 12000, "likes": 120, "has_gguf": True}
    assert "gguf" in first["tags"]
    alias = client.get("/v1/registry/search", params={"q": "tiny", "source": "hf", "limit": 1}).json()
    assert alias["source"] == "huggingface" and len(alias["results"]) == 1 and "format" not in alias
    safetensors = client.get("/v1/registry/search", params={"q": "safetensors"}).json()["results"]
    assert [r["has_gguf"] for r in safetensors] == [False]


def test_registry_search_modelscope(client, hub):
    body = client.get("/v1/registry/search", params={"query": "tiny", "source": "ms", "format": "gguf",
                                                     "limit": 2}).json()
    assert body["source"] == "modelscope" and body["format"] == "gguf"
    assert body["total"] == 3 and len(body["results"]) == 2  # three GGUF repos match "tiny"
    top = body["results"][0]
    assert top["repository_id"] == MQ and top["source"] == "modelscope" and top["has_gguf"]
    assert top["task"] == "image-text-to-text" and top["downloads"] == 500 and top["likes"] == 10
    assert top["description"].startswith("Tiny random weights")
    assert {e["kind"] for e in hub.requests()} == {"ms-search"}


def test_registry_search_errors(client, hub):
    for params, needle in [({"query": "ab"}, "3 characters"), ({}, "query"),
                           ({"query": "gemma", "limit": "0"}, "limit"),
                           ({"query": "gemma", "limit": "51"}, "limit"), ({"query": "gemma", "limit": "x"}, "limit"),
                           ({"query": "gemma", "format": "safetensors"}, "format"),
                           ({"query": "gemma", "source": "github"}, "source")]:
        resp = client.get("/v1/registry/search", params=params)
        assert resp.status_code == 400, params
        assert needle in error_of(resp)["message"], (params, resp.text)
    assert hub.requests() == []
    hub.fail(path="/api/models", status=429, count=1, retry_after=1)
    resp = client.get("/v1/registry/search", params={"query": "gemma"})
    assert resp.status_code == 429
    hub.fail(path="/api/models", status=500, count=None)
    resp = client.get("/v1/registry/search", params={"query": "gemma"})
    assert resp.status_code == 502 and error_of(resp)["upstream_status"] == 500
    hub.reset()
    hub.fail(path="/openapi/v1/models", status=429, count=1)
    assert client.get("/v1/registry/search", params={"query": "gemma", "source": "modelscope"}).status_code == 429
    hub.fail(path="/openapi/v1/models", status=503, count=1)
    resp = client.get("/v1/registry/search", params={"query": "gemma", "source": "modelscope"})
    assert resp.status_code == 502 and error_of(resp)["upstream_status"] == 503


# ----- files and delete ------------------------------------------------------------------------------

def test_register_without_a_checkpoint_then_with_one(client, hub, server):
    """`POST /v1/models/register` (api-lemonade.md): a definition is metadata, so one without a
    checkpoint is registered and listed (not downloaded, nothing fetched); pulling or loading it is a
    400 saying to register it with one, and registering it again with a checkpoint replaces it, after
    which `lemonade pull` fetches the real Gemma and it answers a chat. One definition per call."""
    import openai

    name = "user.Gemma-Later"
    hub.clear_requests()
    reg = client.post("/v1/models/register", json={"model_name": name, "recipe": "llamacpp", "labels": ["chat"]})
    assert reg.status_code == 200, reg.text
    assert reg.json() == {"status": "success", "model_name": "Gemma-Later", "canonical_model_name": name,
                          "model": {"id": "Gemma-Later", "recipe": "llamacpp", "downloaded": False}}
    listed = model(client, name)
    assert listed["checkpoint"] == "" and listed["downloaded"] is False
    assert hub.requests() == []
    for route, body in (("/v1/pull", {"model_name": name}), ("/v1/load", {"model_name": name})):
        refused = client.post(route, json=body)
        assert refused.status_code == 400 and "has no 'main' checkpoint" in error_of(refused)["message"], \
            (route, refused.text)
    cli = run_cli(server, "pull", name)
    assert cli.returncode != 0 and "no 'main' checkpoint" in " ".join(cli.stderr.split())
    again = client.post("/v1/models/register", json={"model_name": name, "recipe": "llamacpp",
                                                     "checkpoint": f"{fx.GEMMA_REPO}:Q4_K_M"})
    assert again.status_code == 200 and again.json()["model"]["downloaded"] is False
    assert hub.downloads() == []  # registering never downloads
    pulled = run_cli(server, "pull", name)
    assert pulled.returncode == 0, pulled.stderr
    assert model(client, name)["downloaded"] is True and model(client, name)["checkpoint"] == f"{fx.GEMMA_REPO}:Q4_K_M"
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    reply = oai.chat.completions.create(model="Gemma-Later", max_tokens=4, temperature=0,
                                        messages=[{"role": "user", "content": "Say hi."}])
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens > 0
    assert client.post("/v1/unload", json={"model_name": name}).status_code == 200


def test_files_of_a_model_never_downloaded(client, hub):
    reg = client.post("/v1/models/register", json={"model_name": "user.later", "recipe": "llamacpp",
                                                   "checkpoint": f"{fx.SAFETENSORS_REPO}:model.safetensors"})
    assert reg.status_code == 200
    assert client.get("/v1/models/user.later/files").json() == {"model_id": "later", "files": []}  # the public id
    assert hub.requests() == []  # listing files never touches the network


def test_delete(client, hub, server):
    # A repository of its own: earlier tests of this module keep files of the shared fixture repos
    # downloaded, and a file a downloaded model uses is never deleted.
    repo = "test-org/del-GGUF"
    hub.clone_repo(MQ, repo)
    for name, quant in (("user.del-a", "Q4_0"), ("user.del-b", "Q4_0"), ("user.del-other", "Q4_K_M")):
        resp = client.post("/v1/pull", json={"model_name": name, "recipe": "llamacpp", "checkpoint": f"{repo}:{quant}"})
        assert resp.status_code == 200, resp.text
    folder = repo_dir(server, repo)
    blob = folder / "blobs" / hub.sha256(repo, "tiny-Q4_0.gguf")
    assert blob.exists()
    resp = client.post("/v1/delete", json={"model_name": "user.del-a"})
    assert resp.json() == {"status": "success", "message": "Deleted model: user.del-a"}
    assert client.get("/v1/models/user.del-a").status_code == 404  # a user model's entry goes too
    # user.del-b uses the same file: it stays, and so user.del-b stays downloaded
    assert blob.exists() and len(list(folder.glob("snapshots/*/tiny-Q4_0.gguf"))) == 1
    assert model(client, "user.del-b")["downloaded"] is True
    # errors
    resp = client.post("/v1/delete", json={})
    assert resp.status_code == 400 and "model_name" in error_of(resp)["message"]
    resp = client.post("/v1/delete", json={"model_name": "nope-nope"})
    assert resp.status_code == 422 and error_of(resp)["code"] == "model_not_found"  # as Lemonade answers it
    resp = client.post("/v1/delete", json={"model_name": "Qwen3-0.6B-GGUF"})
    assert resp.status_code == 400 and error_of(resp)["code"] == "model_not_downloaded"
    resp = client.post("/v1/delete", json={"model_name": "extra.my-local.gguf"})
    assert resp.status_code == 400
    message = error_of(resp)["message"]
    assert "my-local.gguf" in message and os.sep in message  # names the file's path
    # the last user of the file: it goes; the other model of the repository is untouched
    assert client.post("/v1/delete", json={"model_name": "user.del-b"}).status_code == 200
    assert not blob.exists() and snapshot_file(server, repo, "tiny-Q4_0.gguf") is None
    assert model(client, "user.del-other")["downloaded"] is True
    assert client.post("/v1/delete", json={"model_name": "user.del-other"}).status_code == 200
    assert not folder.exists()


def test_delete_removes_every_file_of_a_repository(client, hub, server):
    repo = "test-org/whole-reranking-GGUF"  # its own copy: user.tiny-url (above) holds the fixture repo
    hub.clone_repo(fx.RERANKER_REPO, repo)
    resp = client.post("/v1/pull", json={"model_name": "user.whole", "recipe": "llamacpp", "checkpoint": repo})
    assert resp.status_code == 200, resp.text
    folder = repo_dir(server, repo)
    assert sorted(p.name for p in folder.glob("snapshots/*/*")) == sorted(fx.REPO_FILES[fx.RERANKER_REPO])
    assert client.post("/v1/delete", json={"model_name": "user.whole"}).status_code == 200
    assert not folder.exists()


def snapshot_file(server, repo: str, path: str) -> Path | None:
    found = list(repo_dir(server, repo).glob(f"snapshots/*/{path}"))
    return found[0] if found else None


def test_delete_keeps_files_another_model_uses_in_the_same_repo(client, hub, server):
    """Two models of one repository that share a file (here the mmproj): deleting one keeps the file."""
    repo = "test-org/shared-same-GGUF"
    hub.clone_repo(MQ, repo)
    for name, quant in (("user.same-a", "Q4_K_M"), ("user.same-b", "Q4_0")):
        resp = client.post("/v1/pull", json={"model_name": name, "recipe": "llamacpp", "checkpoints": {
            "main": f"{repo}:{quant}", "mmproj": f"{repo}:{fx.MMPROJ_FILE}"}})
        assert resp.status_code == 200, resp.text
    assert len(fetched(hub, repo=repo, file=fx.MMPROJ_FILE)) == 1  # the second pull reused it

    resp = client.post("/v1/delete", json={"model_name": "user.same-a"})
    assert resp.status_code == 200, resp.text
    assert snapshot_file(server, repo, "tiny-Q4_K_M.gguf") is None  # the file only A used is gone
    assert not (repo_dir(server, repo) / "blobs" / hub.sha256(repo, "tiny-Q4_K_M.gguf")).exists()
    mmproj = snapshot_file(server, repo, fx.MMPROJ_FILE)
    assert mmproj is not None and mmproj.read_bytes() == hub.file_path(repo, fx.MMPROJ_FILE).read_bytes()
    assert model(client, "user.same-b")["downloaded"] is True

    # Ollama's delete of the last user frees the whole repository.
    assert client.request("DELETE", "/api/delete", json={"model": "user.same-b"}).status_code == 200
    assert not repo_dir(server, repo).exists()


def test_delete_keeps_files_another_model_uses_from_another_repo(client, hub, server):
    """The issue's case: A = main from repo 1 + text_encoder from repo 2, B = main from repo 3 + the same
    text_encoder, C a collection whose component shares it too, and the built-in Whisper-Tiny whose
    only file a user model borrows. Real pulls from the local hub; the tiny GGUFs are never loaded."""
    repo1, shared, repo3, kit_repo = ("test-org/cross-1-GGUF", "test-org/cross-shared-GGUF",
                                      "test-org/cross-3-GGUF", "test-org/cross-kit-GGUF")
    for repo in (repo1, shared, repo3, kit_repo):
        hub.clone_repo(MQ, repo)
    encoder = f"{shared}:tiny-F16.gguf"
    for name, main in (("user.cross-a", repo1), ("user.cross-b", repo3)):
        resp = client.post("/v1/pull", json={"model_name": name, "recipe": "sd-cpp", "checkpoints": {
            "main": f"{main}:Q4_K_M", "text_encoder": encoder}})
        assert resp.status_code == 200, resp.text
    events = sse_events(client, {"model_name": "user.CrossKit", "recipe": "collection.omni",
                                 "components": ["user.cross-kit-llm"], "models": [
                                     {"model_name": "user.cross-kit-llm", "recipe": "sd-cpp", "checkpoints": {
                                         "main": f"{kit_repo}:Q4_K_M", "text_encoder": encoder}}]})
    assert events[-1][0] == "complete"
    # A model registered but never pulled holds nothing: it does not keep the shared file alive.
    assert client.post("/v1/models/register", json={"model_name": "user.cross-never", "recipe": "sd-cpp",
                                                    "checkpoints": {"main": f"{repo1}:Q4_0",
                                                                    "text_encoder": encoder}}).status_code == 200
    assert len(fetched(hub, repo=shared)) == 1
    encoder_blob = repo_dir(server, shared) / "blobs" / hub.sha256(shared, "tiny-F16.gguf")

    out = run_cli(server, "delete", "user.cross-a")
    assert out.returncode == 0 and "Deleted model: user.cross-a" in out.stdout, out.stdout + out.stderr
    assert not repo_dir(server, repo1).exists()  # only A used repo 1
    assert encoder_blob.exists() and snapshot_file(server, shared, "tiny-F16.gguf") is not None
    assert model(client, "user.cross-b")["downloaded"] is True
    assert model(client, "user.CrossKit")["downloaded"] is True

    # B goes (Ollama's delete): the collection's component still uses the encoder.
    assert client.request("DELETE", "/api/delete", json={"model": "user.cross-b"}).status_code == 200
    assert not repo_dir(server, repo3).exists() and encoder_blob.exists()
    assert model(client, "user.CrossKit")["downloaded"] is True
    # Deleting the collection removes only its entry; the component (and the encoder) stay.
    assert client.post("/v1/delete", json={"model_name": "user.CrossKit"}).status_code == 200
    assert model(client, "user.cross-kit-llm")["downloaded"] is True
    assert client.post("/v1/delete", json={"model_name": "user.cross-kit-llm"}).status_code == 200
    assert not repo_dir(server, shared).exists() and not repo_dir(server, kit_repo).exists()
    assert client.post("/v1/delete", json={"model_name": "user.cross-never"}).status_code == 200

    # Built-in models are users too: a user model borrowing Whisper-Tiny's file does not take it away.
    whisper = "ggerganov/whisper.cpp"
    hub.create_repo(whisper, {"ggml-tiny.bin": os.urandom(4096), "ggml-tiny-custom.bin": os.urandom(4096)})
    assert client.post("/v1/pull", json={"model_name": "Whisper-Tiny"}).status_code == 200
    resp = client.post("/v1/pull", json={"model_name": "user.borrower", "recipe": "whispercpp", "checkpoints": {
        "main": f"{whisper}:ggml-tiny-custom.bin", "extra": f"{whisper}:ggml-tiny.bin"}})
    assert resp.status_code == 200, resp.text
    assert client.post("/v1/delete", json={"model_name": "user.borrower"}).status_code == 200
    assert model(client, "Whisper-Tiny")["downloaded"] is True
    assert snapshot_file(server, whisper, "ggml-tiny-custom.bin") is None
    assert client.post("/v1/delete", json={"model_name": "Whisper-Tiny"}).status_code == 200
    assert not repo_dir(server, whisper).exists()


# ----- updates ---------------------------------------------------------------------------------------

def test_check_updates_and_update_available(make_server, hub, tmp_path):
    repo = "test-org/updating-GGUF"
    hub.clone_repo(MQ, repo)
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = make_server(env=hub.env(), cache=cache, config={"auto_check_model_updates": False})
    with srv.client() as c:
        assert c.post("/v1/pull", json={"model_name": "user.upd", "recipe": "llamacpp",
                                        "checkpoint": f"{repo}:Q4_K_M"}).status_code == 200
        assert c.get("/v1/health").json()["update_check_done"] is False  # auto check off
        assert c.post("/v1/models/check-updates").json() == {"status": "success", "updates_available": 0,
                                                             "models": []}
        assert c.get("/v1/health").json()["update_check_done"] is True
        hub.write_file(repo, "README.md", "a new commit that does not touch the weights\n")
        assert c.post("/v1/models/check-updates").json()["updates_available"] == 0
        hub.write_file(repo, "tiny-Q4_K_M.gguf", b"GGUF" + os.urandom(3000))
        assert c.post("/v1/models/check-updates").json() == {"status": "success", "updates_available": 1,
                                                             "models": ["upd"]}
        assert model(c, "user.upd")["update_available"] is True
        listed = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert listed["upd"]["update_available"] is True  # listed by its bare name
    srv.stop()

    # The startup check finds it again; pulling fetches the new file and clears the flag.
    srv = make_server(env=hub.env(), cache=cache, config={"auto_check_model_updates": True})
    with srv.client() as c:
        deadline = time.monotonic() + 30
        while not c.get("/v1/health").json()["update_check_done"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert model(c, "user.upd")["update_available"] is True
        hub.clear_requests()
        events = sse_events(c, {"model_name": "user.upd"})
        assert events[-1][0] == "complete"
        assert [e["file"] for e in fetched(hub)] == ["tiny-Q4_K_M.gguf"]
        assert model(c, "user.upd")["update_available"] is False
        folder = srv.cache / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
        assert [p.name for p in (folder / "snapshots").iterdir()] == [hub.commit(repo)]  # old version dropped
        assert len(list((folder / "blobs").iterdir())) == 1


# ----- CLI -------------------------------------------------------------------------------------------

def test_cli_pull_repository_with_variant_flag(server, client, hub):
    out = run_cli(server, "pull", f"{MQ}", "--variant", "ud-q4_k_xl")
    assert out.returncode == 0, out.stderr + out.stdout
    assert "Installed model: user.tiny-multiquant-GGUF-UD-Q4_K_XL" in out.stdout
    obj = model(client, "user.tiny-multiquant-GGUF-UD-Q4_K_XL")
    assert obj["downloaded"] and obj["labels"] == ["custom", "vision", "chat"]
    assert obj["checkpoints"] == {"main": f"{MQ}:UD-Q4_K_XL", "mmproj": f"{MQ}:{fx.MMPROJ_FILE}"}
    # an unknown repository, and a bare repository without a terminal (it needs --variant)
    out = run_cli(server, "pull", fx.EMBEDDING_REPO + "-missing")
    assert out.returncode == 1 and "not found" in out.stderr
    out = run_cli(server, "pull", MQ, input_text="1\n")
    assert out.returncode == 2 and "--variant" in out.stderr and "Q4_K_M" in out.stderr
    # a registered model by name; and the errors of the server come through
    out = run_cli(server, "pull", "user.tiny-q4")
    assert out.returncode == 0 and "Installed model: user.tiny-q4" in out.stdout
    out = run_cli(server, "pull", "Qwen3-0.6B-GGUF")
    assert out.returncode == 1 and "unsloth/Qwen3-0.6B-GGUF" in out.stderr


def test_draft_companions_are_listed_apart_and_pulled_as_the_draft_checkpoint(server, client, hub):
    """As Lemonade since upstream 2505215d2: `mtp-*` / `dflash-*` GGUFs beside a model are no variants
    of it; `draft_files` lists them and `lemonade pull` makes a single one the `draft` checkpoint
    (several: none, with a warning naming them)."""
    from tests.hub.fixtures import write_tiny_gguf

    repo = "draft-org/tiny-mtp-GGUF"
    folder = hub.create_repo(repo)
    write_tiny_gguf(folder / "tiny-Q4_K_M.gguf")
    write_tiny_gguf(folder / "mtp-tiny.gguf", name="mtp", seed=1)
    info = client.get("/v1/pull/variants", params={"checkpoint": repo}).json()
    assert [v["name"] for v in info["variants"]] == ["Q4_K_M"] and info["draft_files"] == ["mtp-tiny.gguf"]
    out = run_cli(server, "pull", repo, "--variant", "Q4_K_M")
    assert out.returncode == 0, out.stderr + out.stdout
    obj = model(client, "user.tiny-mtp-GGUF-Q4_K_M")
    assert obj["checkpoints"] == {"main": f"{repo}:Q4_K_M", "draft": f"{repo}:mtp-tiny.gguf"} and obj["downloaded"]
    assert {f["file"] for f in fetched(hub)} >= {"tiny-Q4_K_M.gguf", "mtp-tiny.gguf"}

    two = "draft-org/tiny-two-drafts-GGUF"
    folder = hub.create_repo(two)
    write_tiny_gguf(folder / "tiny-Q8_0.gguf")
    write_tiny_gguf(folder / "dflash-kquant.gguf", name="dflash", seed=2)
    write_tiny_gguf(folder / "mtp-tiny.gguf", name="mtp", seed=3)
    assert client.get("/v1/pull/variants", params={"checkpoint": two}).json()["draft_files"] == [
        "dflash-kquant.gguf", "mtp-tiny.gguf"]
    out = run_cli(server, "pull", two, "--variant", "Q8_0")
    assert out.returncode == 0 and "several draft models" in out.stderr and "dflash-kquant.gguf" in out.stderr
    pulled = model(client, "user.tiny-two-drafts-GGUF-Q8_0")
    assert pulled["checkpoint"] == f"{two}:Q8_0" and "draft" not in pulled.get("checkpoints", {})


def test_cli_pull_interactive_menu(server, client, hub):
    """The variant menu on a real terminal (a pty): pick entry 4 (Q4_0), then name the model."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update(LEMONADE_BASE_URL=server.url, COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-m", "lemonade.cli.main", "pull", MQ], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    seen = b""
    answers = [(b"variant name", b"4\n"), (b"Model name", b"user.menu-pick\n")]
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
            if answers and answers[0][0] in seen:
                os.write(master, answers.pop(0)[1])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    assert proc.returncode == 0, text
    assert "Select a variant" in text and "3) Q8_0  (2 files" in text and "6) Other" in text
    assert "user.tiny-multiquant-GGUF-Q4_0" in text  # the suggested name, offered as the default
    assert model(client, "user.menu-pick")["checkpoint"] == f"{MQ}:Q4_0"
    assert model(client, "user.menu-pick")["labels"] == ["custom", "vision", "chat"]


def test_cli_delete_and_check_updates(server, client, hub):
    assert client.post("/v1/pull", json={"model_name": "user.cli-del", "recipe": "llamacpp",
                                         "checkpoint": f"{MQ}:Q6_K"}).status_code == 200
    out = run_cli(server, "check-updates")
    assert out.returncode == 0 and "up to date" in out.stdout
    out = run_cli(server, "delete", "user.cli-del")
    assert out.returncode == 0 and "Deleted model: user.cli-del" in out.stdout
    out = run_cli(server, "delete", "user.cli-del")
    assert out.returncode == 1 and "not been found" in out.stderr
