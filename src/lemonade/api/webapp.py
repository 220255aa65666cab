"""The built-in web app: `/` answers a browser with the app and an Ollama client with its probe answer.

Ollama clients (and `curl`) probe `GET /` and expect the plain text `Ollama is running`; a browser
asks for `text/html` and gets the app's page. The app's files are served from `/static/` out of the
package's `web/` folder: plain ES modules and a few vendored libraries, no build step, nothing from
a CDN, so the app works offline. `/` and `/static/*` need no API key (AuthMiddleware): the page asks
for the key and sends it on every API call, like any other client of the public API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
INDEX = WEB_DIR / "index.html"
OLLAMA_PROBE_ANSWER = "Ollama is running"


def wants_html(request: Request) -> bool:
    """A browser navigating to the page (its Accept lists text/html); Ollama clients send none."""
    return "text/html" in request.headers.get("accept", "")


def install_web_app(app: FastAPI) -> None:
    # GET and HEAD as two routes, so each has its own OpenAPI operationId.
    @app.get("/", tags=["status"], response_class=PlainTextResponse,
             summary="The web app for browsers, 'Ollama is running' for Ollama clients")
    @app.head("/", tags=["status"], response_class=PlainTextResponse)
    async def root(request: Request) -> Response:
        if wants_html(request):
            # no-cache: the page names the asset files, so a new version is picked up at once
            return FileResponse(INDEX, media_type="text/html", headers={"Cache-Control": "no-cache"})
        return PlainTextResponse(OLLAMA_PROBE_ANSWER)

    app.mount("/static", StaticFiles(directory=WEB_DIR, check_dir=False), name="static")
