"""Issue 2: model catalog, registration rules, extra models dir, aliases and listing."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from tests.gguf_factory import write_gguf

SPEC_NAMES = ("Qwen3-0.6B-GGUF", "Gemma-3-4b-it-GGUF", "nomic-embed-text-v1-GGUF", "bge-reranker-v2-m3-GGUF",
              "Whisper-Tiny", "kokoro-v1", "SD-Turbo")
MODEL_FIELDS = {"id", "created", "object", "owned_by", "checkpoint", "recipe", "downloaded", "suggested", "labels"}


@pytest.fixture(scope="module")
def extra_dir(tmp_path_factory, gemma_dir):
    """An extra models dir laid out to exercise every naming rule (metadata-only GGUFs + real Gemma)."""
    root = tmp_path_factory.mktemp("extra")
    (root / "gemma-3-270m.gguf").symlink_to(gemma_dir / "gemma-3-270m-q4_k_m.gguf")
    write_gguf(root / "vlm" / "model-Q4_K_M.gguf", context_length=4096)
    write_gguf(root / "vlm" / "mmproj-model-f16.gguf", clip=True)
    write_gguf(root / "big" / "big-Q8_0-00001-of-00002.gguf", split=(1, 2))
    write_gguf(root / "big" / "big-Q8_0-00002-of-00002.gguf", split=(2, 2))
    write_gguf(root / "multi" / "tiny-Q4_0.gguf")
    write_gguf(root / "multi" / "tiny-Q8_0.gguf")
    write_gguf(root / "embed" / "minilm.gguf", "bert", pooling_type=1, context_length=512)
    write_gguf(root / "rerank" / "bge.gguf", "bert", pooling_type=4)
    write_gguf(root / "a" / "dup" / "m.gguf")
    write_gguf(root / "b" / "dup" / "m.gguf")
    return root


@pytest.fixture(scope="module")
def server(module_servers, extra_dir):
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra_dir)})


def listing(srv, show_all=False):
    with srv.client() as c:
        return {m["id"]: m for m in c.get("/v1/models", params={"show_all": show_all}).json()["data"]}


def test_builtin_catalog(server):
    models = listing(server, show_all=True)
    builtin = {k: v for k, v in models.items() if v["recipe"] and v.get("source") != "local"}
    assert len(builtin) >= 20
    for name in SPEC_NAMES:
        assert name in builtin, name
    assert any("270m" in name.lower() for name in builtin)
    for m in builtin.values():
        assert MODEL_FIELDS <= set(m) and m["object"] == "model" and m["owned_by"] == "lemonade"
        assert isinstance(m["size"], float) and isinstance(m["suggested"], bool)
    recipes = {m["recipe"] for m in builtin.values()}
    assert {"llamacpp", "whispercpp", "sd-cpp", "kokoro"} <= recipes
    assert builtin["SD-Turbo"]["image_defaults"] == {"steps": 4, "cfg_scale": 1.0, "width": 512, "height": 512}
    assert not builtin["Qwen3-0.6B-GGUF"]["downloaded"]


def test_default_listing_is_downloaded_only(server):
    models = listing(server)
    assert models and all(m["downloaded"] for m in models.values())
    assert "Qwen3-0.6B-GGUF" not in models


def test_extra_dir_naming_and_labels(server):
    models = listing(server)
    gemma = models["gemma-3-270m"]  # a root file: its stem
    assert gemma["recipe"] == "llamacpp" and gemma["labels"] == ["custom"]
    assert gemma["max_context_window"] == 32768
    assert models["vlm"]["labels"] == ["custom", "vision"]  # a folder of one model: the folder
    assert models["vlm"]["max_context_window"] == 4096
    assert "big" in models  # one shard set in a folder is one model
    assert {"tiny-Q4_0", "tiny-Q8_0"} <= set(models)  # several variants: one per variant
    assert "multi" not in models  # ... whose folder name is only a hidden input name
    assert models["embed"]["labels"] == ["custom", "embeddings"]
    assert models["rerank"]["labels"] == ["custom", "reranking"]
    dups = sorted(k for k in models if k.endswith("dup"))
    assert dups == ["b-dup", "dup"]  # the later claimant is qualified with its grouping folder


def test_extra_names_stable_across_restart(module_servers, extra_dir, server):
    first = sorted(listing(server))
    again = module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra_dir)})
    assert sorted(listing(again)) == first


def test_get_model_and_404(server):
    with server.client() as c:
        model = c.get("/v1/models/Qwen3-0.6B-GGUF").json()
        assert model["id"] == "Qwen3-0.6B-GGUF" and model["checkpoint"].startswith("unsloth/")
        resp = c.get("/v1/models/No-Such-Model")
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["type"] == "not_found" and "No-Such-Model has not been found" in err["message"]


def test_openai_client_lists_and_retrieves(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    ids = [m.id for m in client.models.list()]
    assert "gemma-3-270m" in ids
    for name in ("gemma-3-270m", "extra.gemma-3-270m", "extra.gemma-3-270m.gguf"):  # bare, canonical, old id
        assert client.models.retrieve(name).id == "gemma-3-270m"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


# ----- registration ----------------------------------------------------------------------------

def test_register_user_model(make_server):
    srv = make_server()
    with srv.client() as c:
        resp = c.post("/v1/models/register", json={"model_name": "user.Phi-4-Mini-GGUF", "recipe": "llamacpp",
                                                    "checkpoint": "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M",
                                                    "reasoning": True})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["status"] == "success" and body["canonical_model_name"] == "user.Phi-4-Mini-GGUF"
        assert body["model_name"] == "Phi-4-Mini-GGUF"  # the public id: it shadows nothing
        assert body["model"] == {"id": "Phi-4-Mini-GGUF", "recipe": "llamacpp", "downloaded": False}
        model = c.get("/v1/models/user.Phi-4-Mini-GGUF").json()
        assert model["labels"] == ["custom", "reasoning", "chat"] and model["downloaded"] is False
    stored = json.loads((srv.config_dir / "user_models.json").read_text())
    assert stored["Phi-4-Mini-GGUF"]["checkpoint"] == "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M"


@pytest.mark.parametrize("body,message", [
    ({"model_name": "user.Clf", "recipe": "llamacpp", "checkpoint": "example/model:Q4_K_M",
      "labels": ["classification"]},
     "Model 'user.Clf': recipe 'llamacpp' cannot serve 'classification'. It serves 'chat', 'embeddings', "
     "'reranking'. Omit the label to deploy as 'chat'."),
    ({"model_name": "user.Both", "recipe": "llamacpp", "checkpoint": "example/model:Q4_K_M",
      "labels": ["chat", "embeddings"]},
     "Model 'user.Both': a model deploys in exactly one mode, but these labels name two: 'chat' and "
     "'embeddings'. Register one model per mode."),
    ({"model_name": "user.Legacy", "recipe": "llamacpp", "checkpoint": "example/model:Q4_K_M",
      "embedding": True, "reranking": True},
     "a model deploys in exactly one mode, but these labels name two: 'embeddings' and 'reranking'"),
    ({"model_name": "NoPrefix", "recipe": "llamacpp", "checkpoint": "a/b:Q4_K_M"}, "'user.' namespace"),
    ({"model_name": "user.NoMain", "recipe": "llamacpp", "checkpoints": {"mmproj": "a/b:mmproj.gguf"}},
     "a 'checkpoint' (or a 'main' entry in 'checkpoints') is required"),
    ({"model_name": "user.Kit", "recipe": "collection.omni", "components": ["user.A"],
      "models": [{"model_name": "user.A", "recipe": "llamacpp", "checkpoint": "a/b:Q4_0"}]},
     "'models' embeds more model definitions"),
    ({"model_name": "user.Pricey", "recipe": "llamacpp", "latency_ms_hint": -3},
     "'latency_ms_hint' must be a number of milliseconds, 0 or more"),
    ({"model_name": "user.BadCkpt", "recipe": "llamacpp", "checkpoint": "not-a-repo"}, "owner/repo"),
    ({"model_name": "user.BadRecipe", "recipe": "nope", "checkpoint": "a/b"}, "unknown recipe 'nope'"),
    ({"model_name": "user.BadLabels", "recipe": "llamacpp", "checkpoint": "a/b", "labels": "vision"}, "labels"),
    ({"recipe": "llamacpp", "checkpoint": "a/b"}, "model_name"),
    ({"model_name": "user.Whisper", "recipe": "whispercpp", "checkpoint": "a/b", "labels": ["chat"]},
     "recipe 'whispercpp' cannot serve 'chat'"),
])
def test_invalid_registration_is_400_and_writes_nothing(server, body, message):
    path = server.config_dir / "user_models.json"
    before = path.read_bytes() if path.exists() else None
    with server.client() as c:
        resp = c.post("/v1/models/register", json=body)
    assert resp.status_code == 400
    assert message in resp.json()["error"]["message"]
    assert (path.read_bytes() if path.exists() else None) == before


def test_invalid_stored_entry_is_skipped_and_file_untouched(make_server, tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    content = json.dumps({
        "Good": {"recipe": "llamacpp", "checkpoint": "a/good:Q4_K_M"},
        "Bad": {"recipe": "llamacpp", "checkpoint": "a/bad:Q4_K_M", "labels": ["chat", "embeddings"]},
    }, indent=1)
    (config / "user_models.json").write_text(content)
    srv = make_server(env={"LEMONADE_CONFIG_DIR": str(config)})
    models = listing(srv, show_all=True)
    assert models["Good"]["checkpoint"] == "a/good:Q4_K_M" and "Bad" not in models
    assert (config / "user_models.json").read_text() == content
    assert "user.Bad" in srv.log() and "Skipping invalid entry" in srv.log()


def test_local_path_models_from_lemonades_user_models_file(make_server, tmp_path, gemma_dir):
    """Lemonade's local imports in user_models.json (`source: local_path`, checkpoints as absolute file
    paths): listed, downloaded when every file is there, served from those files; one with a file gone
    is listed as not downloaded, and pulling it (or a collection naming it) says which file is missing.
    A `/v1/pull` body may not name such paths."""
    config = tmp_path / "config"
    config.mkdir()
    mine = tmp_path / "files" / "mine.gguf"
    mine.parent.mkdir()
    mine.symlink_to(gemma_dir / "gemma-3-270m-q4_k_m.gguf")
    gone = tmp_path / "files" / "gone.gguf"
    (config / "user_models.json").write_text(json.dumps({
        "Mine": {"recipe": "llamacpp", "checkpoint": str(mine), "source": "local_path"},
        "Half": {"recipe": "llamacpp", "checkpoints": {"main": str(mine), "vae": str(gone)},
                 "source": "local_path"},
        "Both": {"recipe": "collection.omni", "components": ["Half"]}}))
    # keys set: paths are shown to the admin only, so the test needs a user and an admin to tell them apart
    srv = make_server(env={"LEMONADE_CONFIG_DIR": str(config), "LEMONADE_API_KEY": "k",
                           "LEMONADE_ADMIN_API_KEY": "admin"})
    user, admin = {"Authorization": "Bearer k"}, {"Authorization": "Bearer admin"}
    with srv.client() as c:
        listed = {m["id"]: m for m in c.get("/v1/models?show_all=true", headers=user).json()["data"]}
        assert listed["Mine"]["downloaded"] is True and listed["Half"]["downloaded"] is False
        assert listed["Half"]["checkpoints"] == {"main": "mine.gguf", "vae": "gone.gguf"}  # not the paths
        assert c.get("/v1/models/user.Mine", headers=admin).json()["checkpoint"] == str(mine)
        answer = c.post("/v1/chat/completions", headers=user, json={
            "model": "user.Mine", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
        assert answer.status_code == 200, answer.text
        for name in ("user.Half", "user.Both"):
            resp = c.post("/v1/pull", headers=admin, json={"model_name": name})
            assert resp.status_code == 404 and str(gone) in resp.json()["error"]["message"], resp.text
        assert "Downloading component: Half" in srv.log()
        resp = c.post("/v1/pull", headers=admin, json={"model_name": "user.Other", "recipe": "llamacpp",
                                                       "checkpoint": str(mine), "source": "local_path"})
        assert resp.status_code == 400 and "local_path" in str(resp.json()["error"]), resp.text


# ----- aliases ---------------------------------------------------------------------------------

def test_aliases_crud_and_resolution(server):
    with server.client() as c:
        resp = c.post("/internal/aliases", json={"alias": "prod", "target": "extra.gemma-3-270m"})
        assert resp.json() == {"status": "ok", "alias": "prod", "target": "extra.gemma-3-270m"}
        aliases = c.get("/internal/aliases").json()["aliases"]
        assert {"alias": "prod", "target": "extra.gemma-3-270m", "downloaded": True,
                "recipe": "llamacpp"} in aliases
        # an alias is its own entry: its id, the target's recipe, files and state
        entry = c.get("/v1/models/prod").json()
        assert entry["id"] == "prod" and entry["alias_target"] == "gemma-3-270m" and entry["downloaded"] is True
        assert {k: v for k, v in entry.items() if k not in ("id", "alias_target")} == \
            {k: v for k, v in c.get("/v1/models/gemma-3-270m").json().items() if k != "id"}
        assert "prod" in listing(server)
        # re-pointing switches at once
        c.post("/internal/aliases", json={"alias": "prod", "model": "extra.vlm"})
        assert c.get("/v1/models/prod").json()["alias_target"] == "vlm"
        for taken in ("vlm", "extra.vlm", "builtin.prod", "user.prod"):  # model ids are not aliases
            assert c.post("/internal/aliases", json={"alias": taken, "target": "vlm"}).status_code == 400
        assert c.post("/internal/aliases", json={"alias": "x", "target": "no-such-model"}).status_code == 400
        assert c.post("/internal/aliases", json={"alias": "y"}).status_code == 400
        assert c.post("/internal/aliases", json={"target": "extra.vlm"}).status_code == 400
        assert c.delete("/internal/aliases/prod").json() == {"status": "deleted", "alias": "prod"}
        assert c.delete("/internal/aliases/prod").status_code == 404
        assert c.get("/v1/models/prod").status_code == 404
    assert json.loads((server.config_dir / "aliases.json").read_text()) == {}


def test_extra_dir_change_is_picked_up(make_server, tmp_path, gemma_dir):
    root = tmp_path / "models"
    root.mkdir()
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(root)})
    assert not [v for v in listing(srv).values() if v.get("source") == "local"]
    shutil.copy(gemma_dir / "gemma-3-270m-q4_k_m.gguf", root / "g.gguf")
    assert "g" in listing(srv)


# ----- naming spec through the API (rules one by one: tests/test_naming.py) ----------------------

def test_shadowing_through_the_api(make_server, tmp_path):
    """Built-in + registered + extra of one bare name: what /v1/models, /v1/models/{id}, /api/tags
    and the options file show, the reserved prefixes refused, and the same ids after a restart."""
    root = tmp_path / "models"
    write_gguf(root / "Qwen3-0.6B-GGUF.gguf")
    cache, config = tmp_path / "cache", tmp_path / "config"
    cache.mkdir()
    config.mkdir()
    (config / "recipe_options.json").write_text(json.dumps({"Whisper-Tiny": {"whispercpp_args": ""}}))
    env = {"LEMONADE_EXTRA_MODELS_DIR": str(root), "LEMONADE_CONFIG_DIR": str(config)}
    srv = make_server(cache=cache, env=env)
    ids = ["Qwen3-0.6B-GGUF", "extra.Qwen3-0.6B-GGUF", "builtin.Qwen3-0.6B-GGUF"]
    with srv.client() as c:
        assert json.loads((config / "recipe_options.json").read_text()) == {  # migrated at start
            "builtin.Whisper-Tiny": {"whispercpp_args": ""}}
        shown = [k for k in listing(srv, show_all=True) if k.endswith("Qwen3-0.6B-GGUF")]
        assert sorted(shown) == sorted([ids[0], ids[2]])  # the extra file wins the bare name over the built-in
        assert c.get("/v1/models/Qwen3-0.6B-GGUF").json()["source"] == "local"
        resp = c.post("/v1/models/register", json={"model_name": "user.Qwen3-0.6B-GGUF", "recipe": "llamacpp",
                                                    "checkpoint": "someone/Qwen3-0.6B-GGUF:Q8_0"})
        assert resp.status_code == 200 and resp.json()["model_name"] == "Qwen3-0.6B-GGUF"
        listed = listing(srv, show_all=True)
        assert sorted(k for k in listed if k.endswith("Qwen3-0.6B-GGUF")) == sorted(ids)
        assert listed["Qwen3-0.6B-GGUF"]["checkpoint"] == "someone/Qwen3-0.6B-GGUF:Q8_0"
        assert listed["builtin.Qwen3-0.6B-GGUF"]["checkpoint"].startswith("unsloth/")
        for name, expect in [("Qwen3-0.6B-GGUF", ids[0]), ("user.Qwen3-0.6B-GGUF", ids[0]),
                             ("extra.Qwen3-0.6B-GGUF", ids[1]), ("builtin.Qwen3-0.6B-GGUF", ids[2])]:
            assert c.get(f"/v1/models/{name}").json()["id"] == expect, name
        assert c.get("/v1/models/builtin.No-Such").status_code == 404
        tags = [m["name"] for m in c.get("/api/tags").json()["models"]]
        assert "extra.Qwen3-0.6B-GGUF:latest" in tags  # the downloaded one, shadowed: canonical id
        for name in ("user.builtin.Qwen3-0.6B-GGUF", "builtin.Foo", "extra.Foo"):
            for route in ("/v1/models/register", "/v1/pull"):
                resp = c.post(route, json={"model_name": name, "recipe": "llamacpp", "checkpoint": "a/b:Q4_0"})
                assert resp.status_code == 400, (route, name)
                assert "reserved" in str(resp.json()["error"]), resp.text
        c.post("/v1/models/builtin.Qwen3-0.6B-GGUF/options", json={"ctx_size": 1024})
        c.post("/v1/models/Qwen3-0.6B-GGUF/options", json={"ctx_size": 2048})
        c.post("/v1/models/extra.Qwen3-0.6B-GGUF/options", json={"ctx_size": 4096})
    assert json.loads((config / "recipe_options.json").read_text()) == {
        "builtin.Whisper-Tiny": {"whispercpp_args": ""}, "builtin.Qwen3-0.6B-GGUF": {"ctx_size": 1024},
        "user.Qwen3-0.6B-GGUF": {"ctx_size": 2048}, "extra.Qwen3-0.6B-GGUF": {"ctx_size": 4096}}
    srv.stop()
    again = make_server(cache=cache, env=env)
    assert {k: v["checkpoint"] for k, v in listing(again, show_all=True).items()} == \
        {k: v["checkpoint"] for k, v in listed.items()}
    with again.client() as c:
        assert c.get("/v1/models/builtin.Qwen3-0.6B-GGUF/options").json()["saved"] == {"ctx_size": 1024}
