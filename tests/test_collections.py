"""Registering collections (`collection.omni`, `collection.router`) through `/v1/pull`: the ids they
are listed under, the components they show, re-registration, and the definitions that are refused.

Lemonade lists a registered collection under its `user.` id everywhere (`/v1/models`, Ollama's
`/api/tags` with `:latest`, MCP's `lemonade_list_models`), though its bare name still resolves to
it; its components are shown by their public ids, whichever spelling registered them. The members
are the real Gemma 3 270M GGUF of the extra models dir (`gemma-3-270m-q4_k_m`) and a second name
for it registered here (downloaded from the local hub); nothing in this file starts an engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import GEMMA_ID, GEMMA_NAME, Server, ServerFactory, call, texts
from tests.hub import fixtures as fx

COMPANION = "user.Companion"  # a registered model: listed bare (it shadows nothing), stored as user.


@pytest.fixture(scope="module")
def server(module_servers: ServerFactory, hub_server: Any, gemma_dir: Path) -> Server:
    return module_servers(env={**hub_server.env(), "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)})


@pytest.fixture(scope="module")
def http(server: Server) -> httpx.Client:
    with server.client() as client:
        # A registered model (the same Gemma file, downloaded from the local hub): listed bare.
        resp = client.post("/v1/pull", json={"model_name": COMPANION, "recipe": "llamacpp",
                                             "checkpoint": f"{fx.GEMMA_REPO}:{fx.GEMMA_FILE}"})
        assert resp.status_code == 200, resp.text
        yield client


def listed(http: httpx.Client, **params: str) -> dict[str, dict]:
    return {m["id"]: m for m in http.get("/v1/models", params=params).json()["data"]}


def register(http: httpx.Client, body: dict) -> httpx.Response:
    return http.post("/v1/pull", json=body)


def stored(server: Server) -> dict:
    path = server.config_dir / "user_models.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("recipe", ["collection.omni", "collection.router"])
def test_collection_listed_under_its_user_id_everywhere(http: httpx.Client, server: Server,
                                                        recipe: str) -> None:
    name = f"user.Listed-{recipe.split('.')[1]}"
    body = {"model_name": name, "recipe": recipe, "components": [GEMMA_NAME, "Companion"]}
    if recipe == "collection.router":
        body |= {"version": "1", "routing": {"candidates": [GEMMA_NAME, "Companion"], "default_model": GEMMA_NAME,
                                             "rules": [{"id": "code", "match": {"keywords_any": ["def "]},
                                                        "route_to": "Companion"}]}}
    resp = register(http, body)
    assert resp.status_code == 200 and resp.json()["status"] == "success", resp.text
    bare = name.removeprefix("user.")
    for listing in (listed(http), listed(http, show_all="true")):
        assert name in listing and bare not in listing
        entry = listing[name]
        assert entry["recipe"] == recipe and entry["downloaded"] is True
        # Components by their public ids: the registered model shows bare, however it was given.
        assert entry["components"] == [GEMMA_NAME, "Companion"]
    for lookup in (name, bare):
        got = http.get(f"/v1/models/{lookup}")
        assert got.status_code == 200 and got.json()["id"] == name
    tags = {m["name"] for m in http.get("/api/tags").json()["models"]}
    assert f"{name}:latest" in tags and f"{bare}:latest" not in tags
    assert "Companion:latest" in tags  # a plain registered model keeps its bare name
    for lookup in (name, bare):
        assert http.post("/api/show", json={"model": lookup}).status_code == 200
    listing_text = "\n".join(texts(call(server, "lemonade_list_models", {})))
    assert f'"{name}"' in listing_text and f'"{bare}"' not in listing_text


def test_components_given_by_canonical_id_are_shown_public(http: httpx.Client) -> None:
    resp = register(http, {"model_name": "user.Spelled", "recipe": "collection.omni",
                           "components": [GEMMA_ID, COMPANION]})
    assert resp.status_code == 200, resp.text
    entry = listed(http)["user.Spelled"]
    assert entry["components"] == [GEMMA_NAME, "Companion"] and entry["downloaded"] is True


def test_re_registering_replaces_the_components(http: httpx.Client, server: Server) -> None:
    assert register(http, {"model_name": "user.Grows", "recipe": "collection.omni",
                           "components": [GEMMA_NAME]}).status_code == 200
    resp = register(http, {"model_name": "user.Grows", "recipe": "collection.omni",
                           "components": [GEMMA_NAME, COMPANION]})
    assert resp.status_code == 200, resp.text
    assert listed(http)["user.Grows"]["components"] == [GEMMA_NAME, "Companion"]
    assert stored(server)["Grows"]["components"] == [GEMMA_NAME, COMPANION]


REFUSED = [
    pytest.param({"components": ["user.Self"]}, "cannot reference itself", id="self"),
    pytest.param({"components": ["Self"]}, "cannot reference itself", id="self-by-bare-name"),
    pytest.param({"components": ["user.Listed-omni"]}, "must be models, not collections", id="nested-by-name"),
    pytest.param({"components": ["Child"], "models": [{"model_name": "Child", "recipe": "collection.omni",
                                                       "components": [GEMMA_NAME]}]},
                 "must be models, not collections", id="nested-inline"),
    pytest.param({"components": [GEMMA_NAME, "Nowhere"]}, "'Nowhere' is not registered and 'models' has no "
                 "matching definition", id="unknown-component"),
    pytest.param({"components": ["Half"], "models": [{"model_name": "Half"}]},
                 "incomplete definition for component 'Half'", id="incomplete-inline-definition"),
    pytest.param({"components": []}, "'components'", id="empty"),
]


@pytest.mark.parametrize(("change", "message"), REFUSED)
def test_refused_collections_name_the_problem_and_store_nothing(http: httpx.Client, server: Server,
                                                               change: dict, message: str) -> None:
    if change.get("components") == ["user.Listed-omni"] and "user.Listed-omni" not in listed(http):
        register(http, {"model_name": "user.Listed-omni", "recipe": "collection.omni", "components": [GEMMA_NAME]})
    before = stored(server)
    resp = register(http, {"model_name": "user.Self", "recipe": "collection.omni", **change})
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"], resp.json()
    assert stored(server) == before
    assert http.get("/v1/models/user.Self").status_code == 404


def test_unprefixed_collection_name_is_refused(http: httpx.Client) -> None:
    resp = register(http, {"model_name": "NoPrefix", "recipe": "collection.omni", "components": [GEMMA_NAME]})
    assert resp.status_code == 400 and "'user.' namespace" in resp.json()["error"]


def test_a_pull_records_its_registry_provenance(http: httpx.Client, server: Server) -> None:
    """Beside the repository's cache folder, `.lemonade_registry.json` names the registry and, per
    model, the snapshot its pull processed (where Lemonade keeps it); the model shows its registry."""
    (folder,) = server.cache.rglob("models--" + fx.GEMMA_REPO.replace("/", "--"))
    record = json.loads((folder / ".lemonade_registry.json").read_text())
    assert record["registry_source"] == "huggingface"
    assert record["processed_models"]["Companion"]["snapshot_id"] == (folder / "refs" / "main").read_text()
    assert http.get(f"/v1/models/{COMPANION}").json()["registry_source"] == "huggingface"
