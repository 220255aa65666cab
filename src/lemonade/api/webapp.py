"""The built-in web app: `/` answers with the app's page, as Lemonade's own server does.

Lemonade's app, its tests and its users' scripts read `GET /` as HTML even for a plain `*/*` request
(what `requests`, `httpx` and `curl` send); Ollama clients only check that `/` answers 200, so they
are served too. Only a client that asks for plain text alone (`Accept: text/plain`) gets Ollama's
probe answer, `Ollama is running`. The app's files are served from `/static/` out of the
package's `web/` folder: plain ES modules and a few vendored libraries, no build step, nothing from
a CDN, so the app works offline. `/` and `/static/*` need no API key (`open` in route_table.py): the page asks
for the key and sends it on every API call, like any other client of the public API.

Lemonade's own addresses of its app work too: its entry module `/renderer.bundle.js` (ours is the
one the page loads), and the page and its files under the older `/web-app/` prefix. A path there
that climbs out of the app's folder (`..`, a backslash) is refused with 403, as Lemonade refuses it;
a name that merely contains dots is looked up and, absent, answers 404.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

from lemonade.errors import APIError

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
INDEX = WEB_DIR / "index.html"
ENTRY = "renderer.bundle.js"  # the entry module, under the name Lemonade's app gives its own
LEGACY_PREFIX = "/web-app"  # Lemonade's earlier address of the app
OLLAMA_PROBE_ANSWER = "Ollama is running"


def wants_plain_text(request: Request) -> bool:
    """Accept names text/plain and neither HTML nor a wildcard: the one case for the probe text."""
    accept = request.headers.get("accept", "").lower()
    return "text/plain" in accept and "text/html" not in accept and "*/*" not in accept and "text/*" not in accept


def install_web_app(app: FastAPI) -> None:
    # GET and HEAD as two routes, so each has its own OpenAPI operationId.
    @app.get("/", tags=["status"], response_class=HTMLResponse,
             summary="The web app's page ('Ollama is running' for an Accept of text/plain alone)")
    @app.head("/", tags=["status"], response_class=HTMLResponse)
    async def root(request: Request) -> Response:
        if wants_plain_text(request):
            return PlainTextResponse(OLLAMA_PROBE_ANSWER)
        # no-cache: the page names the asset files, so a new version is picked up at once
        return FileResponse(INDEX, media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=WEB_DIR, check_dir=False), name="static")

    @app.get("/" + ENTRY, include_in_schema=False)
    async def entry() -> Response:
        return app_file(ENTRY)

    @app.get(LEGACY_PREFIX, include_in_schema=False)
    @app.get(LEGACY_PREFIX + "/{relative:path}", include_in_schema=False)
    async def legacy(relative: str = "") -> Response:
        return app_file(relative or INDEX.name)


def app_file(relative: str) -> FileResponse:
    """The app's file at `relative` (already percent-decoded): 403 for a path that leaves the app's
    folder, 404 for one that is not there."""
    parts = relative.replace("\\", "/").split("/")
    target = (WEB_DIR / relative).resolve()
    if ".." in parts or not target.is_relative_to(WEB_DIR):
        raise APIError(403, f"'{relative}' is outside the web app's files", code="forbidden_path")
    if not target.is_file():
        raise APIError(404, f"The web app has no file '{relative}'", code="not_found")
    headers = {"Cache-Control": "no-cache"} if target == INDEX else None
    return FileResponse(target, headers=headers)
