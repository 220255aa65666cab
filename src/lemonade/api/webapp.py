"""The built-in web app: `/` answers with the app's page, as Lemonade's own server does.

Lemonade's app, its tests and its users' scripts read `GET /` as HTML even for a plain `*/*` request
(what `requests`, `httpx` and `curl` send); Ollama clients only check that `/` answers 200, so they
are served too. Only a client that asks for plain text alone (`Accept: text/plain`) gets Ollama's
probe answer, `Ollama is running`. The app's files are served from `/static/` out of the
package's `web/` folder: plain ES modules and a few vendored libraries, no build step, nothing from
a CDN, so the app works offline. `/` and `/static/*` need no API key (AuthMiddleware): the page asks
for the key and sends it on every API call, like any other client of the public API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
INDEX = WEB_DIR / "index.html"
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
