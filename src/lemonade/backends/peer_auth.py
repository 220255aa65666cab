"""How two servers of a LAN prove to each other that they hold `LEMONADE_PEER_KEY`, without sending it.

A beacon can be forged, and a peer URL may be typed wrong: the key itself never leaves a server.
Instead, a mutual challenge (both nonces random, every proof an HMAC-SHA256 of the key over both
nonces and the role it proves, so no proof can stand for another):

1. the client sends its nonce `c` (`POST /peers/challenge`); the server answers its own nonce `s`
   and `server_proof = HMAC(key, "server", c, s)`;
2. the client checks that proof, and only then sends `client_proof = HMAC(key, "client", c, s)`
   (`POST /peers/session`); a client that could not check it sends nothing more;
3. the server checks it once (the pending `s` is consumed) and both now know the session token
   `HMAC(key, "session", c, s)`, which neither sends during the exchange. Forwarded requests carry
   it in the `X-Lemonade-Peer` header until it expires.

`PeerGate` is the server's half: pending challenges and open sessions, in memory, bounded. No I/O
and the clock passed in, so the rules are tested in milliseconds (tests/unit/test_peer_rules.py).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

KEY_ENV = "LEMONADE_PEER_KEY"
HEADER = "X-Lemonade-Peer"  # the session token on a forwarded request
MIN_KEY_CHARS = 16  # a shorter key could be found offline from one recorded exchange
PROTOCOL = b"lemonade-peer-1"
NONCE = re.compile(r"^[0-9a-f]{32,128}$")
CHALLENGE_SECONDS = 30.0  # a challenge must be answered this soon
SESSION_SECONDS = 900.0  # a session lasts this long; clients open a new one before it ends
MAX_PENDING = 256  # challenges waiting for their answer (the oldest are dropped first)
MAX_SESSIONS = 1024


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(key: bytes, role: str, client_nonce: str, server_nonce: str) -> str:
    """HMAC-SHA256 of the key over the protocol, the role it proves and both nonces."""
    message = b"\n".join((PROTOCOL, role.encode(), client_nonce.encode(), server_nonce.encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def session_token(key: bytes, client_nonce: str, server_nonce: str) -> str:
    return proof(key, "session", client_nonce, server_nonce)


def matches(given: object, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def key_problem(key: str | None) -> str | None:
    """Why `key` cannot be used (None: it can)."""
    if not key:
        return f"{KEY_ENV} is not set"
    if len(key) < MIN_KEY_CHARS:
        return (f"{KEY_ENV} is shorter than {MIN_KEY_CHARS} characters, so a recorded handshake could give it "
                "away; make one with: python3 -c \"import secrets; print(secrets.token_urlsafe(32))\"")
    return None


@dataclass
class Session:
    expires: float
    peer: str  # who opened it (its instance id and address), for the log and /v1/health


class PeerGate:
    """A server's side of the exchange: it answers challenges, opens sessions and admits the
    requests that carry one. `key` None: this server takes no forwarded requests."""

    def __init__(self, key: str | None, instance: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._key = key.encode() if key_problem(key) is None and key else None
        self.instance = instance  # this server's random id: a server that hears itself knows it
        self._clock = clock
        self._pending: OrderedDict[str, tuple[str, float]] = OrderedDict()  # server nonce -> (client nonce, until)
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def open(self) -> bool:
        return self._key is not None

    def challenge(self, client_nonce: object) -> dict[str, str]:
        """`{"server_nonce", "proof", "instance"}` for a client's nonce; ValueError for a malformed one."""
        assert self._key is not None
        if not isinstance(client_nonce, str) or not NONCE.match(client_nonce):
            raise ValueError("'client_nonce' must be 32 to 128 lowercase hex digits")
        self._expire()
        server_nonce = new_nonce()
        self._pending[server_nonce] = (client_nonce, self._clock() + CHALLENGE_SECONDS)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)
        return {"server_nonce": server_nonce, "proof": proof(self._key, "server", client_nonce, server_nonce),
                "instance": self.instance}

    def open_session(self, client_nonce: object, server_nonce: object, client_proof: object, peer: str) -> bool:
        """Open a session when the client proved the key for a challenge of ours that is still
        pending (each one answers once)."""
        assert self._key is not None
        if not isinstance(server_nonce, str) or not isinstance(client_nonce, str):
            return False
        self._expire()
        pending = self._pending.pop(server_nonce, None)
        if pending is None or pending[0] != client_nonce:
            return False
        if not matches(client_proof, proof(self._key, "client", client_nonce, server_nonce)):
            return False
        token = session_token(self._key, client_nonce, server_nonce)
        self._sessions[token] = Session(self._clock() + SESSION_SECONDS, peer)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return True

    def admits(self, token: str) -> bool:
        """Whether a request carrying `token` comes from a holder of the key (a session still open)."""
        session = self._sessions.get(token)
        if session is None:
            return False
        if session.expires <= self._clock():
            del self._sessions[token]
            return False
        return True

    def sessions(self) -> list[str]:
        """Who holds an open session (for /v1/health)."""
        now = self._clock()
        return sorted({s.peer for s in self._sessions.values() if s.expires > now})

    def _expire(self) -> None:
        now = self._clock()
        for nonce in [n for n, (_, until) in self._pending.items() if until <= now]:
            del self._pending[nonce]
        for token in [t for t, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[token]
