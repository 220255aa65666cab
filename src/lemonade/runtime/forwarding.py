"""Where a request goes when this server does not serve it: a peer of the LAN (backends/peer/peers.py).

Three questions, asked at three moments: `elsewhere` when a name is not this server's model (resolve),
`forwarded` once a request's model is checked (a peer that has it loaded while this server has not
answers sooner), and `instead` when a peer failed a request before answering (the proxy asks the next
peer, or this server's own model). A request a peer forwarded here stays here. The proxy takes
`instead` as it is built, so this room sits beside it, below every entry point.
"""

from __future__ import annotations

from lemonade.backends.peer.engine import FAILOVER_CODES, LOCAL_ONLY_ENDPOINTS, PeerEngine
from lemonade.backends.peer.peers import Peers
from lemonade.backends.registry import Engines
from lemonade.catalog.catalog import Catalog
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_request import EngineError
from lemonade.runtime.request_context import from_peer
from lemonade.runtime.router import Router


class PeerForwarding:
    """The peer choices of one server, from its catalog, engines, peers and router."""

    def __init__(self, catalog: Catalog, engines: Engines, peers: Peers, router: Router) -> None:
        self.catalog, self.engines, self.peers, self.router = catalog, engines, peers, router

    def elsewhere(self, name: str) -> ModelInfo | None:
        """A model this server does not have but a peer of the LAN serves: by its id, or addressed on
        one peer as `<id>@<host:port>`."""
        return self.peers.named(name) or self._on_peer(name, here=False)

    def _on_peer(self, name: str, here: bool) -> ModelInfo | None:
        """The peer's model that serves a request for `name` (`here`: this server has it too, not
        loaded), or None: this server serves it. A request a peer forwarded here stays here."""
        if not self.peers.forwarding or from_peer.get():
            return None
        targets = self.peers.targets(name, here=here, loaded_here=False)
        return self.peers.bound(targets[0], name) if targets else None

    def forwarded(self, model: ModelInfo, endpoint: str) -> ModelInfo:
        """`model`, or the same model on a peer that has it loaded while this server has not."""
        if model.recipe == PeerEngine.recipe and endpoint in LOCAL_ONLY_ENDPOINTS:
            raise APIError(400, f"{endpoint} is not forwarded to peers; ask {model.definition['peer']}, where "
                           f"{model.definition['upstream_id']} lives, directly", code="invalid_argument")
        engine = self.engines.get(model.recipe)
        if (not self.peers.forwarding or engine is None or engine.remote or endpoint in LOCAL_ONLY_ENDPOINTS
                or self.router.resident(model.name) is not None):
            return model
        return self._on_peer(model.public, here=True) or model

    def instead(self, model: ModelInfo, path: str, error: EngineError) -> tuple[ModelInfo, str] | None:
        """After a peer failed a request before answering (backends/peer/engine.py `FAILOVER_CODES`; it is
        marked down): the next peer with the model, else this server's own model at its engine's path
        for the same endpoint, else None (the error stands)."""
        if model.recipe != PeerEngine.recipe or error.code not in FAILOVER_CODES:
            return None
        name = model.definition["upstream_id"]
        local = self.catalog.find(name)
        other = self._on_peer(name, here=local is not None)
        if other is not None:
            return other, path
        return (local, path_for) if local is not None and (path_for := self._local_path(local, path)) else None

    def _local_path(self, model: ModelInfo, peer_path: str) -> str | None:
        """The path of `model`'s engine for the endpoint a peer was asked at `peer_path` (its query
        kept); None where this server's engine takes another request for it (pictures: the engine
        makes their body, backends/peer/engine.py)."""
        engine = self.engines.get(model.recipe)
        base, _, query = peer_path.partition("?")
        endpoint = PeerEngine.endpoint_of(base)
        path = engine.endpoints.get(endpoint) if engine is not None and endpoint is not None else None
        return None if path is None else path + (f"?{query}" if query else "")
