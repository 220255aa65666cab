"""How two servers of a LAN prove to each other that they hold `LEMONADE_PEER_KEY`, without sending it.

A beacon can be forged, and a peer URL may be typed wrong: the key itself never leaves a server.
Instead, a mutual challenge (both nonces random, every proof an HMAC-SHA256 of the key over both
nonces, the server's address and the role it proves, so no proof can stand for another):

1. the client sends its nonce `c` (`POST /peers/challenge`); the server answers its own nonce `s`,
   the address `a` the connection reached it at (its socket's `ip:port`) and
   `server_proof = HMAC(key, "server", c, s, a)`;
2. the client checks that `a` is the address it connected to and the proof, and only then sends
   `client_proof = HMAC(key, "client", c, s, a)` (`POST /peers/session`); a client that could not
   check them sends nothing more;
3. the server checks it once (the pending `s` is consumed) and both now know the session token
   `HMAC(key, "session", c, s, a)`, which neither sends during the exchange. Forwarded requests carry
   it in the `X-Lemonade-Peer` header until it expires.

The address is what defeats a relay: a forger that passes a client's challenge on to a real member
gets that member's proof, but for the member's address, not its own, and the client stops there.
So peers must reach each other directly (no NAT or reverse proxy between them).

`PeerGate` is the server's half: pending challenges and open sessions, in memory, bounded. No I/O
and the clock passed in, so the rules are tested in milliseconds (tests/unit/test_peer_rules.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
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


def proof(key: bytes, role: str, client_nonce: str, server_nonce: str, address: str) -> str:
    """HMAC-SHA256 of the key over the protocol, the role it proves, both nonces and the server's address."""
    message = b"\n".join((PROTOCOL, role.encode(), client_nonce.encode(), server_nonce.encode(), address.encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def session_token(key: bytes, client_nonce: str, server_nonce: str, address: str) -> str:
    return proof(key, "session", client_nonce, server_nonce, address)


def matches(given: object, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def address_text(host: str, port: int) -> str:
    """`ip:port` as both sides write it: an IPv6 address in brackets, any IP in its normal form."""
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host.strip("[]")))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
        # server nonce -> (client nonce, the address it was asked at, until)
        self._pending: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def open(self) -> bool:
        return self._key is not None

    def challenge(self, client_nonce: object, address: str) -> dict[str, str]:
        """`{"server_nonce", "address", "proof", "instance"}` for a client's nonce, asked at `address`
        (this server's `ip:port` of the connection); ValueError for a malformed nonce."""
        assert self._key is not None
        if not isinstance(client_nonce, str) or not NONCE.match(client_nonce):
            raise ValueError("'client_nonce' must be 32 to 128 lowercase hex digits")
        self._expire()
        server_nonce = new_nonce()
        self._pending[server_nonce] = (client_nonce, address, self._clock() + CHALLENGE_SECONDS)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)
        return {"server_nonce": server_nonce, "address": address, "instance": self.instance,
                "proof": proof(self._key, "server", client_nonce, server_nonce, address)}

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
        address = pending[1]
        if not matches(client_proof, proof(self._key, "client", client_nonce, server_nonce, address)):
            return False
        token = session_token(self._key, client_nonce, server_nonce, address)
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
        for nonce in [n for n, (_, _, until) in self._pending.items() if until <= now]:
            del self._pending[nonce]
        for token in [t for t, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[token]
