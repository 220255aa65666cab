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
    builtin = {k: v for k, v in models.items() if not k.startswith(("extra.", "user."))}
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
    gemma = models["extra.gemma-3-270m.gguf"]
    assert gemma["recipe"] == "llamacpp" and gemma["labels"] == ["custom"]
    assert gemma["max_context_window"] == 32768
    assert models["extra.vlm"]["labels"] == ["custom", "vision"]
    assert models["extra.vlm"]["max_context_window"] == 4096
    assert "extra.big" in models  # one shard set in a folder is one model
    assert {"extra.tiny-Q4_0", "extra.tiny-Q8_0"} <= set(models)  # several variants: one per variant
    assert models["extra.embed"]["labels"] == ["custom", "embeddings"]
    assert models["extra.rerank"]["labels"] == ["custom", "reranking"]
    dups = sorted(k for k in models if k.endswith("dup"))
    assert dups == ["extra.b--dup", "extra.dup"]


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
    assert "extra.gemma-3-270m.gguf" in ids
    model = client.models.retrieve("extra.gemma-3-270m.gguf")
    assert model.id == "extra.gemma-3-270m.gguf"
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
        assert body["model"] == {"id": "user.Phi-4-Mini-GGUF", "recipe": "llamacpp", "downloaded": False}
        model = c.get("/v1/models/user.Phi-4-Mini-GGUF").json()
        assert model["labels"] == ["reasoning"] and model["downloaded"] is False
    stored = json.loads((srv.cache / "user_models.json").read_text())
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
    ({"model_name": "user.NoCkpt", "recipe": "llamacpp"}, "checkpoint"),
    ({"model_name": "user.BadCkpt", "recipe": "llamacpp", "checkpoint": "not-a-repo"}, "owner/repo"),
    ({"model_name": "user.BadRecipe", "recipe": "nope", "checkpoint": "a/b"}, "unknown recipe 'nope'"),
    ({"model_name": "user.BadLabels", "recipe": "llamacpp", "checkpoint": "a/b", "labels": "vision"}, "labels"),
    ({"recipe": "llamacpp", "checkpoint": "a/b"}, "model_name"),
    ({"model_name": "user.Whisper", "recipe": "whispercpp", "checkpoint": "a/b", "labels": ["chat"]},
     "recipe 'whispercpp' cannot serve 'chat'"),
])
def test_invalid_registration_is_400_and_writes_nothing(server, body, message):
    path = server.cache / "user_models.json"
    before = path.read_bytes() if path.exists() else None
    with server.client() as c:
        resp = c.post("/v1/models/register", json=body)
    assert resp.status_code == 400
    assert message in resp.json()["error"]["message"]
    assert (path.read_bytes() if path.exists() else None) == before


def test_invalid_stored_entry_is_skipped_and_file_untouched(make_server, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    content = json.dumps({
        "Good": {"recipe": "llamacpp", "checkpoint": "a/good:Q4_K_M"},
        "Bad": {"recipe": "llamacpp", "checkpoint": "a/bad:Q4_K_M", "labels": ["chat", "embeddings"]},
    }, indent=1)
    (cache / "user_models.json").write_text(content)
    srv = make_server(cache=cache)
    models = listing(srv, show_all=True)
    assert "user.Good" in models and "user.Bad" not in models
    assert (cache / "user_models.json").read_text() == content
    assert "user.Bad" in srv.log() and "Skipping invalid entry" in srv.log()


# ----- aliases ---------------------------------------------------------------------------------

def test_aliases_crud_and_resolution(server):
    with server.client() as c:
        resp = c.post("/internal/aliases", json={"alias": "prod", "target": "extra.gemma-3-270m.gguf"})
        assert resp.json() == {"status": "ok", "alias": "prod", "target": "extra.gemma-3-270m.gguf"}
        aliases = c.get("/internal/aliases").json()["aliases"]
        assert {"alias": "prod", "target": "extra.gemma-3-270m.gguf", "downloaded": True,
                "recipe": "llamacpp"} in aliases
        assert c.get("/v1/models/prod").json()["id"] == "extra.gemma-3-270m.gguf"
        # re-pointing switches at once
        c.post("/internal/aliases", json={"alias": "prod", "model": "extra.vlm"})
        assert c.get("/v1/models/prod").json()["id"] == "extra.vlm"
        assert c.post("/internal/aliases", json={"alias": "x", "target": "no-such-model"}).status_code == 400
        assert c.post("/internal/aliases", json={"alias": "y"}).status_code == 400
        assert c.post("/internal/aliases", json={"target": "extra.vlm"}).status_code == 400
        assert c.delete("/internal/aliases/prod").json() == {"status": "deleted", "alias": "prod"}
        assert c.delete("/internal/aliases/prod").status_code == 404
        assert c.get("/v1/models/prod").status_code == 404
    assert json.loads((server.cache / "aliases.json").read_text()) == {}


def test_extra_dir_change_is_picked_up(make_server, tmp_path, gemma_dir):
    root = tmp_path / "models"
    root.mkdir()
    srv = make_server(env={"LEMONADE_EXTRA_MODELS_DIR": str(root)})
    assert not [k for k in listing(srv) if k.startswith("extra.")]
    shutil.copy(gemma_dir / "gemma-3-270m-q4_k_m.gguf", root / "g.gguf")
    assert "extra.g.gguf" in listing(srv)
