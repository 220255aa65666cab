"""`/peers/*`: what another server of the LAN asks this one before it forwards requests here.

The handshake (backends/peer/auth.py) proves `LEMONADE_PEER_KEY` in both directions without sending
it; the API key does not guard these routes (api/middleware.py), the key does. A server without a
usable key answers 403 to all of them, so a peer knows at once that it takes no forwarded requests.

- `POST /peers/challenge` `{"client_nonce"}` -> `{"server_nonce", "address", "proof", "instance"}`, the
  address being this server's end of the connection (`ip:port`), which the proof covers;
- `POST /peers/session` `{"client_nonce", "server_nonce", "proof", "instance", "hostname"}` ->
  `{"expires_in", "instance", "hostname"}`, or 401 when the proof is wrong (or late, or used);
- `GET /peers/models` with the session in `X-Lemonade-Peer`: the models this server serves itself
  (its `/v1/models` objects with their deployment `mode`) and the ids of those loaded now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request

from lemonade.api.errors import APIError
from lemonade.backends.peer.auth import HEADER, KEY_ENV, SESSION_SECONDS, address_text
from lemonade.services import Services
from lemonade.serving.models import model_object

router = APIRouter(prefix="/peers", tags=["peers"])
log = logging.getLogger("lemonade.peers")
LISTING_SECONDS = 10.0  # the served models are listed afresh at most this often (the loaded ones always)


def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    if not svc.peers.gate.open:
        raise APIError(403, f"This server takes no forwarded requests: {svc.peers.key_problem} (every member of the "
                       "LAN's peers needs the same key)", type="forbidden", code="peers_disabled")
    return svc


async def _object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise APIError(400, "Send a JSON object", code="invalid_json")
    return body


@router.post("/challenge")
async def challenge(request: Request) -> dict[str, str]:
    svc = _services(request)
    body = await _object(request)
    host, port = request.scope.get("server") or ("", 0)
    try:
        return svc.peers.gate.challenge(body.get("client_nonce"), address_text(host, port))
    except ValueError as exc:
        raise APIError(400, f"Invalid value for 'client_nonce': {exc}", code="invalid_argument") from None


@router.post("/session")
async def session(request: Request) -> dict[str, Any]:
    svc = _services(request)
    body = await _object(request)
    client = request.client.host if request.client else "?"
    who = f"{body.get('hostname', '?')} ({client})"
    if not svc.peers.gate.open_session(body.get("client_nonce"), body.get("server_nonce"), body.get("proof"), who):
        log.warning("Peer session refused to %s: its proof of %s is wrong, late or used twice", who, KEY_ENV)
        raise APIError(401, f"The proof does not show {KEY_ENV} (another key?), or it answers a challenge that is "
                       "unknown, expired or already answered", type="authentication_error", code="peer_refused")
    log.info("Peer session opened for %s", who)
    return {"expires_in": SESSION_SECONDS, "instance": svc.peers.instance, "hostname": svc.peers.hostname}


@router.get("/models")
async def peer_models(request: Request) -> dict[str, Any]:
    svc = _services(request)
    if not svc.peers.gate.admits(request.headers.get(HEADER, "")):
        raise APIError(401, f"Open a peer session first (POST /peers/challenge, then /peers/session; {HEADER} "
                       "carries it)", type="authentication_error", code="peer_session_required")
    cached = getattr(request.app.state, "peer_listing", None)
    if cached is None or time.monotonic() - cached[0] > LISTING_SECONDS:
        cached = (time.monotonic(), await asyncio.to_thread(served_models, svc))
        request.app.state.peer_listing = cached
    loaded = [lm.model.public for lm in svc.router.models() if not lm.remote]
    return {"instance": svc.peers.instance, "hostname": svc.peers.hostname, "data": cached[1], "loaded": loaded}


def served_models(svc: Services) -> list[dict[str, Any]]:
    """The models this server itself runs (no cloud or peer model: a peer asks those where they live),
    downloaded or loaded, as `/v1/models` lists them, each with its deployment mode."""
    loaded = {lm.model.name for lm in svc.router.models()}
    out = []
    for model in svc.catalog.all():
        engine = svc.engines.get(model.recipe)
        if engine is None or engine.remote or not engine.available or model.is_collection:
            continue
        obj = model_object(svc, model)
        if obj["downloaded"] or model.name in loaded:
            out.append({**obj, "mode": model.mode})
    return out
