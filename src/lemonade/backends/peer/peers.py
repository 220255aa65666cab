"""The other servers of the LAN this one forwards to: who they are, what they serve, who answers.

Opt-in: config `peers` names them (a list of base URLs, or "auto" for the servers heard by the
discovery beacons, beacon.py) and every member holds the same `LEMONADE_PEER_KEY`. Every
`POLL_SECONDS` each peer is asked for its models (`GET /peers/models`, with a session opened by
the challenge of backends/peer/auth.py; the key itself is never sent), so the server knows which models each
one has and which it has loaded. A peer that does not answer, or answers without proving the key,
is skipped until it does.

The choice of where a request goes is `targets` (pure): a model this server has loaded stays here;
one it has but has not loaded goes to a peer that has it loaded, if any; one it does not have goes
to a peer that has it, loaded ones first. A peer's model is bound in the router like a cloud model
(backends/peer/engine.py: no process, no slot) under `<model id>@<host:port>`, built here (`bound`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from lemonade.backends.peer.auth import (
    HEADER,
    KEY_ENV,
    SESSION_SECONDS,
    PeerGate,
    address_text,
    key_problem,
    matches,
    new_nonce,
    proof,
    session_token,
)
from lemonade.beacon import INTERVAL_S, BeaconListener
from lemonade.model_info import ModelInfo

log = logging.getLogger("lemonade.peers")
RECIPE = "peer"
POLL_SECONDS = 2.0  # how stale a peer's list of loaded models may be
POLL_TIMEOUT = httpx.Timeout(5.0, connect=2.0)  # a peer that takes longer is down for this round
CONNECT_SECONDS = 2.0  # a forwarded request's connection; a LAN peer answers in well under that
HEARD_SECONDS = 5 * INTERVAL_S  # a server whose beacon was not heard this long is no peer of "auto"
REFUSED_RETRY_SECONDS = 30.0  # a server that did not prove the key is asked again this often
RENEW_BEFORE = SESSION_SECONDS / 3  # a session is renewed when it has less than this left


def peers_setting(value: Any) -> list[str] | str:
    """`peers` as the config holds it: "auto", or base URLs without a trailing slash (config.py checks it)."""
    return value if value == "auto" else list(value) if isinstance(value, list) else []


def label(url: str) -> str:
    """host:port of a base URL: the part of a bound model's name that says where it lives."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


async def addresses(url: str) -> set[str]:
    """The `ip:port` a connection to `url` may reach (its host resolved), as backends/peer/auth.py writes them."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {address_text(str(info[4][0]), port) for info in infos}


@dataclass
class Peer:
    url: str
    state: str = "new"  # new, up, down, refused (did not prove the key), self (this very server)
    error: str = ""
    hostname: str = ""
    instance: str = ""
    token: str | None = None
    session_until: float = 0.0
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> its listing object (with "mode")
    loaded: frozenset[str] = frozenset()
    failed_attempts: int = 0  # forwarded requests that found it not answering
    next_try: float = 0.0  # a refused peer is asked again from then on

    @property
    def up(self) -> bool:
        return self.state == "up" and self.token is not None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "state": self.state, "hostname": self.hostname,
                               "models": sorted(self.models), "loaded": sorted(self.loaded),
                               "failed_attempts": self.failed_attempts}
        if self.error:
            out["error"] = self.error
        return out


def targets(name: str, here: bool, loaded_here: bool, peers: list[Peer]) -> list[Peer]:
    """Where a request for model `name` goes, in order of preference (empty: this server).

    `here`: this server has the model; `loaded_here`: it has it loaded. Only peers that are up count;
    among them, the ones that have it loaded come first, in the order the peers are listed."""
    if loaded_here:
        return []
    live = [p for p in peers if p.up and name in p.models]
    loaded = [p for p in live if name in p.loaded]
    if here:
        return loaded
    return loaded + [p for p in live if name not in p.loaded]


class Peers:
    """This server's peers (the client side) and its own gate for theirs (`gate`, the server side)."""

    def __init__(self, config: Any, environ: dict[str, str] | None = None) -> None:
        self.config = config
        env = os.environ if environ is None else environ
        key = env.get(KEY_ENV) or None
        self.key_problem = key_problem(key)  # None: the key can be used
        self._key = key.encode() if key and self.key_problem is None else None
        self.instance = secrets.token_hex(8)
        self.hostname = socket.gethostname() or "unknown"
        self.gate = PeerGate(key, self.instance)
        self._peers: dict[str, Peer] = {}
        self._bound: dict[tuple[str, str], ModelInfo] = {}
        self._listener: BeaconListener | None = None
        self._listening: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        # What to do when a peer stops answering: unbind its models (services.py), so health lists
        # none of them and the next request chooses again.
        self.on_down: Callable[[str], Any] = lambda url: None

    # ----- configuration -------------------------------------------------------------------------
    def setting(self) -> list[str] | str:
        return peers_setting(self.config.get("peers"))

    @property
    def forwarding(self) -> bool:
        """Whether this server forwards requests at all (peers configured and a usable key)."""
        return self._key is not None and bool(self.setting())

    def urls(self) -> list[str]:
        setting = self.setting()
        if setting != "auto":
            return list(setting)
        if self._listener is None:
            return []
        return [b.base_url for b in self._listener.recent(HEARD_SECONDS)]

    # ----- what the peers serve -------------------------------------------------------------------
    def peers(self) -> list[Peer]:
        return list(self._peers.values())

    def get(self, url: str) -> Peer | None:
        return self._peers.get(url)

    def targets(self, name: str, here: bool, loaded_here: bool) -> list[Peer]:
        if not self.forwarding:
            return []
        return targets(name, here, loaded_here, self.peers())

    def bound(self, peer: Peer, name: str) -> ModelInfo:
        """The model `name` of `peer` as this server's router holds it: a model of the peer engine
        (backends/peer/engine.py) named `<name>@<host:port>`, with the mode and labels the peer lists."""
        listing = peer.models.get(name, {})
        key = (peer.url, name)
        model = self._bound.get(key)
        mode, labels = str(listing.get("mode") or "chat"), [str(x) for x in listing.get("labels") or []]
        if model is None or model.mode != mode or model.labels != labels:
            definition: dict[str, Any] = {"recipe": RECIPE, "peer": peer.url, "upstream_id": name,
                                          "upstream_recipe": listing.get("recipe", "")}
            if isinstance(listing.get("context_length"), int):
                definition["context_length"] = listing["context_length"]
            size, image_defaults = listing.get("size"), listing.get("image_defaults")
            model = ModelInfo(name=f"{name}@{label(peer.url)}", recipe=RECIPE, mode=mode, labels=labels,
                              size=size if isinstance(size, (int, float)) else None, source="peer", origin="peer",
                              definition=definition,
                              image_defaults=image_defaults if isinstance(image_defaults, dict) else None)
            self._bound[key] = model
        return model

    def named(self, name: str) -> ModelInfo | None:
        """A model addressed on one peer, `<model id>@<host:port>` (the name `bound` gives it), while
        that peer is up and serves it."""
        upstream, _, where = name.rpartition("@")
        for peer in self.peers():
            if where and label(peer.url) == where and peer.up and upstream in peer.models:
                return self.bound(peer, upstream)
        return None

    def listing(self) -> dict[str, list[tuple[Peer, dict[str, Any]]]]:
        """Every model the peers that are up serve: id -> (peer, its listing object), loaded first."""
        out: dict[str, list[tuple[Peer, dict[str, Any]]]] = {}
        for peer in self.peers():
            if peer.up:
                for name, obj in peer.models.items():
                    out.setdefault(name, []).append((peer, obj))
        for holders in out.values():
            holders.sort(key=lambda h: h[1].get("id") not in h[0].loaded)
        return out

    def failed(self, url: str, reason: str) -> None:
        """A forwarded request found the peer not answering (or refusing our session): it is skipped
        until a poll finds it answering again."""
        peer = self._peers.get(url)
        if peer is None:
            return
        peer.failed_attempts += 1
        if "session" in reason:
            peer.token = None  # the next poll opens a new one
        self._set(peer, "down", reason)

    def describe(self) -> dict[str, Any]:
        """`peers` of `/v1/health`."""
        return {"enabled": self.forwarding, "setting": self.setting(), "key": self.key_problem or "set",
                "instance": self.instance, "members": [p.describe() for p in self.peers()],
                "sessions_from": self.gate.sessions()}

    # ----- the background work ----------------------------------------------------------------------
    def start(self, http: httpx.AsyncClient) -> None:
        if self._task is None:
            self._changed = asyncio.Event()
            self.config.on_change(self._config_changed)
            self._task = asyncio.ensure_future(self._run(http))
        if self.setting() and self.key_problem is not None:
            log.error("Config key 'peers' is set, but this server forwards nothing: %s (on every member)",
                      self.key_problem)

    def _config_changed(self, changed: dict[str, Any]) -> None:
        if "peers" in changed and self._changed is not None:
            loop = self._task.get_loop() if self._task is not None else None
            if loop is not None:
                loop.call_soon_threadsafe(self._changed.set)

    async def stop(self) -> None:
        for task in (self._task, self._listening):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._listening = None

    async def _run(self, http: httpx.AsyncClient) -> None:
        assert self._changed is not None
        while True:
            try:
                await self.refresh(http)
            except Exception:  # one bad round must not stop the polling
                log.exception("Polling the peers failed")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), POLL_SECONDS)

    def _listen(self, on: bool) -> None:
        """Beacons are heard only while `peers` is "auto"."""
        if on and self._listening is None:
            self._listener = BeaconListener()
            self._listening = asyncio.ensure_future(self._listener.run())
        elif not on and self._listening is not None:
            self._listening.cancel()
            self._listener = self._listening = None

    async def refresh(self, http: httpx.AsyncClient) -> None:
        """One round: the peer list brought up to date with the setting (and the beacons), then every
        peer asked for its models."""
        self._listen(self.forwarding and self.setting() == "auto")
        if self._listening is not None and self._listening.done():
            log.error("Cannot hear discovery beacons for peers: \"auto\": %r", self._listening.exception())
            self._listener = self._listening = None
        urls = self.urls() if self.forwarding else []
        for url in [u for u in self._peers if u not in urls]:
            log.info("Peer %s is no longer one of this server's peers", url)
            self._peers.pop(url)
            self.on_down(url)
        for url in urls:
            self._peers.setdefault(url, Peer(url))
        await asyncio.gather(*(self._poll(peer, http) for peer in self.peers()))

    async def _poll(self, peer: Peer, http: httpx.AsyncClient) -> None:
        if peer.state == "self" or (peer.state == "refused" and time.monotonic() < peer.next_try):
            return
        try:
            if peer.token is None or peer.session_until - time.monotonic() < RENEW_BEFORE:
                await self._open_session(peer, http)
            if peer.token is None:
                return
            resp = await http.get(peer.url + "/peers/models", headers={HEADER: peer.token}, timeout=POLL_TIMEOUT)
            if resp.status_code == 401:  # it restarted (its sessions are gone): a new one next round
                peer.token = None
                self._set(peer, "down", "it no longer knows our session (restarted?); opening a new one")
                return
            resp.raise_for_status()
            answer = resp.json()
            peer.models = {obj["id"]: obj for obj in answer["data"] if isinstance(obj, dict) and "id" in obj}
            peer.loaded = frozenset(x for x in answer.get("loaded", []) if isinstance(x, str))
            peer.hostname = str(answer.get("hostname") or peer.hostname)
            self._set(peer, "up", "")
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            why = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else \
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._set(peer, "down", f"did not answer ({why})")

    async def _open_session(self, peer: Peer, http: httpx.AsyncClient) -> None:
        """The challenge of backends/peer/auth.py, the client's half: the peer proves the key first; only then
        do we prove it in turn. Nothing but nonces and proofs is sent."""
        assert self._key is not None
        client_nonce = new_nonce()
        resp = await http.post(peer.url + "/peers/challenge", json={"client_nonce": client_nonce}, timeout=POLL_TIMEOUT)
        if resp.status_code != 200:
            self._refuse(peer, f"it answered the peer challenge with HTTP {resp.status_code}: it takes no peers "
                               f"(is {KEY_ENV} set on it?)")
            return
        answer = resp.json()
        server_nonce, address = str(answer.get("server_nonce", "")), str(answer.get("address", ""))
        if answer.get("instance") == self.instance:
            self._set(peer, "self", "this server itself")
            return
        contacted = await addresses(peer.url)
        if address not in contacted:
            self._refuse(peer, f"it answered for the address {address or '(none)'}, not {', '.join(sorted(contacted))} "
                               "that we connected to: another server's answer passed on (a relay), or NAT or a proxy "
                               "between us (peers must reach each other directly); nothing is sent to it")
            return
        if not server_nonce or not matches(answer.get("proof"),
                                           proof(self._key, "server", client_nonce, server_nonce, address)):
            self._refuse(peer, f"it did not prove that it holds {KEY_ENV} (another key, or not a Lemonade server): "
                               "nothing is sent to it")
            return
        resp = await http.post(peer.url + "/peers/session", timeout=POLL_TIMEOUT, json={
            "client_nonce": client_nonce, "server_nonce": server_nonce,
            "proof": proof(self._key, "client", client_nonce, server_nonce, address),
            "instance": self.instance, "hostname": self.hostname})
        if resp.status_code != 200:
            self._refuse(peer, f"it refused our proof of {KEY_ENV} (HTTP {resp.status_code})")
            return
        expires_in = resp.json().get("expires_in")
        lifetime = float(expires_in) if isinstance(expires_in, (int, float)) else SESSION_SECONDS
        peer.token = session_token(self._key, client_nonce, server_nonce, address)
        peer.session_until = time.monotonic() + min(lifetime, SESSION_SECONDS)
        peer.instance = str(answer.get("instance") or "")

    def _refuse(self, peer: Peer, reason: str) -> None:
        peer.token = None
        peer.models, peer.loaded = {}, frozenset()
        peer.next_try = time.monotonic() + REFUSED_RETRY_SECONDS
        self._set(peer, "refused", reason)

    def _set(self, peer: Peer, state: str, error: str) -> None:
        """A peer's state, logged when it changes."""
        if peer.state == state and peer.error == error:
            return
        was = peer.state
        peer.state, peer.error = state, error
        if state == "up":
            log.info("Peer %s (%s) is up: %d model(s), loaded: %s", peer.url, peer.hostname, len(peer.models),
                     ", ".join(sorted(peer.loaded)) or "none")
        elif state == "self":
            log.info("Peer %s is this server itself; skipped", peer.url)
        elif was != state:
            log.warning("Peer %s is %s: %s", peer.url, state, error)
        if state in ("down", "refused") and was == "up":
            self.on_down(peer.url)
