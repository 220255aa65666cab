"""The route table (src/lemonade/route_table.py): the lookup every part uses, and that the table is the
app's own list of routes, so a route added to the app without its row (or a row left behind) fails here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.routing import Mount

from lemonade.api import responses
from lemonade.api.app import create_app
from lemonade.config import Config
from lemonade.observability.logs import LogBuffer
from lemonade.route_table import EMPTY, OWN, PREFIXES, REFUSED, ROUTES, route_of, split
from lemonade.services import Services


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_path_under_any_prefix_is_its_route(prefix):
    chat = route_of(prefix + "/chat/completions")
    assert chat is not None and chat.path == "/chat/completions"
    assert (chat.family, chat.span, chat.streams, chat.model_from) == (
        "openai", ("LLM", "chat.completions"), True, ("json", ("model",)))
    assert route_of(prefix + "/messages").error_family == "anthropic"
    assert route_of(prefix + "/live") is None  # served at the root only
    assert route_of(prefix + "/chat") is None  # Ollama's, under /api only


def test_the_root_and_ollama_have_their_own_routes():
    assert split("/api/chat") == ("ollama", "/chat") and split("/api/v1/chat") == ("api", "/chat")
    assert split("/api/v1") == ("ollama", "/v1") and split("/v1") == ("root", "/v1")
    ollama_chat = route_of("/api/chat")
    assert ollama_chat is not None and (ollama_chat.family, ollama_chat.error_family) == ("ollama", "ollama")
    assert route_of("/api/embeddings").family == "ollama" and route_of("/v1/embeddings").family == "openai"
    live = route_of("/live")
    assert live is not None and live.open and live.metrics_family == "live"
    assert route_of("/chat/completions") is None and route_of("/nothing") is None and route_of("/v1") is None
    pin = route_of("/internal/pin")
    assert pin is not None and (pin.family, pin.error_family, pin.open) == ("internal", "openai", False)


def test_templates_match_one_segment_or_the_rest():
    options = route_of("/api/v1/models/user.Qwen3-0.6B-GGUF/options")
    assert options is not None and options.path == "/models/{model_id}/options"
    assert options.model_from == ("path", ("model_id",))
    assert route_of("/v1/models/check-updates").path == "/models/check-updates"  # a fixed path wins
    assert route_of("/v1/models/a/b") is None
    assert route_of("/static/js/chat.js").open and route_of("/static") is None
    assert route_of("/web-app/deep/file.css").open and route_of("/web-app").open


def test_where_a_request_names_its_model():
    assert route_of("/api/show").model_from == ("json", ("model", "name"))  # older Ollama clients send `name`
    assert route_of("/v1/load").model_from == ("json", ("model_name", "model"))
    assert route_of("/v1/audio/transcriptions").model_from == ("form", ("model",))
    assert route_of("/realtime").model_from == ("query", ("model",))
    assert route_of("/v1/health").model_from is None and route_of("/api/tags").model_from is None


def _served(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, method) of every route an app serves; a WebSocket's method is "websocket"."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _served(inner.routes, prefix + route.include_context.prefix)
        elif isinstance(route, Mount):  # the web app's files
            for method in ("get", "head"):
                yield prefix + route.path + "/{path:path}", method
        else:
            for method in getattr(route, "methods", None) or ["websocket"]:
                yield prefix + route.path, method.lower()


def test_the_table_lists_exactly_the_routes_the_app_serves(tmp_path):
    services = Services(tmp_path / "cache", Config(tmp_path / "config", cli_overrides={}, environ={}), LogBuffer())
    served = set(_served(create_app(services).router.routes))
    listed = {(path, method) for route in ROUTES for path in route.full_paths()
              for method in (["websocket"] if route.websocket else route.methods)}
    assert sorted(served - listed) == [], "served by the app, missing from route_table.ROUTES"
    assert sorted(listed - served) == [], "in route_table.ROUTES, not served by the app"



def test_every_named_success_answer_is_documented():
    names = {answer for route in ROUTES for answer in route.methods.values()} - {EMPTY, OWN, REFUSED}
    assert sorted(n for n in names if not hasattr(responses, n)) == [], "not in api/responses.py"
