"""The rules of peers: the key's challenge (backends/peer/auth.py), where a request goes
(backends/peer/peers.py `targets`) and the `peers` setting (config.py). Pure functions and a clock
passed in: no server, no network. That real servers in network namespaces forward, fail over and
refuse a server without the key is proven end to end in tests/test_peers.py."""

from __future__ import annotations

import json

import pytest

from lemonade.backends.peer import auth as peer_auth
from lemonade.backends.peer.auth import PeerGate, proof, session_token
from lemonade.backends.peer.peers import Peer, targets
from lemonade.config import Config, ConfigError

KEY = "a-shared-key-of-the-lan-0123456789"
ADDRESS = "10.0.0.3:13305"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def handshake(gate: PeerGate, key: str = KEY, address: str = ADDRESS) -> tuple[dict[str, str], str, bool]:
    """A client's whole exchange with `gate`, holding `key`: (the challenge's answer, the session token
    it derives, whether the gate opened the session)."""
    client_nonce = peer_auth.new_nonce()
    answer = gate.challenge(client_nonce, address)
    k = key.encode()
    opened = gate.open_session(client_nonce, answer["server_nonce"],
                               proof(k, "client", client_nonce, answer["server_nonce"], answer["address"]), "a")
    return answer, session_token(k, client_nonce, answer["server_nonce"], answer["address"]), opened


def test_both_holders_of_the_key_prove_it_and_share_a_session_the_key_never_crosses():
    gate = PeerGate(KEY, "server-1")
    client_nonce = peer_auth.new_nonce()
    answer = gate.challenge(client_nonce, ADDRESS)
    assert answer["address"] == ADDRESS and answer["instance"] == "server-1"
    # the client can check the server's proof before it says anything of its own
    assert peer_auth.matches(answer["proof"], proof(KEY.encode(), "server", client_nonce, answer["server_nonce"],
                                                    ADDRESS))
    client_proof = proof(KEY.encode(), "client", client_nonce, answer["server_nonce"], ADDRESS)
    assert gate.open_session(client_nonce, answer["server_nonce"], client_proof, "a")
    token = session_token(KEY.encode(), client_nonce, answer["server_nonce"], ADDRESS)
    assert gate.admits(token) and not gate.admits("0" * 64)
    exchanged = json.dumps([client_nonce, answer, client_proof])
    assert KEY not in exchanged and token not in exchanged  # neither the key nor the session is ever sent
    # the three proofs differ: none can stand for another
    assert len({answer["proof"], client_proof, token}) == 3


def test_a_client_with_another_key_gets_no_session_and_cannot_check_the_server():
    gate = PeerGate(KEY, "server-1")
    answer, token, opened = handshake(gate, key="another-key-of-someone-else-42")
    assert not opened and not gate.admits(token)
    client_nonce = peer_auth.new_nonce()
    answer = gate.challenge(client_nonce, ADDRESS)
    assert not peer_auth.matches(answer["proof"], proof(b"another-key-of-someone-else-42", "server", client_nonce,
                                                        answer["server_nonce"], ADDRESS))


def test_a_challenge_answers_once_and_only_in_time():
    clock = Clock()
    gate = PeerGate(KEY, "server-1", clock=clock)
    client_nonce = peer_auth.new_nonce()
    answer = gate.challenge(client_nonce, ADDRESS)
    client_proof = proof(KEY.encode(), "client", client_nonce, answer["server_nonce"], ADDRESS)
    assert gate.open_session(client_nonce, answer["server_nonce"], client_proof, "a")
    assert not gate.open_session(client_nonce, answer["server_nonce"], client_proof, "a")  # a replay
    late = gate.challenge(client_nonce, ADDRESS)
    clock.now += peer_auth.CHALLENGE_SECONDS + 1
    assert not gate.open_session(client_nonce, late["server_nonce"],
                                 proof(KEY.encode(), "client", client_nonce, late["server_nonce"], ADDRESS), "a")


def test_the_server_proof_is_no_client_proof_and_names_its_address():
    """Reflection (the server's own proof sent back as the client's) fails, and a proof made for one
    address does not hold for another: a relay that passes a member's answer on is seen."""
    gate = PeerGate(KEY, "server-1")
    client_nonce = peer_auth.new_nonce()
    answer = gate.challenge(client_nonce, ADDRESS)
    assert not gate.open_session(client_nonce, answer["server_nonce"], answer["proof"], "a")
    relayed = gate.challenge(client_nonce, ADDRESS)
    assert relayed["proof"] != proof(KEY.encode(), "server", client_nonce, relayed["server_nonce"], "10.0.0.9:13305")


def test_sessions_expire():
    clock = Clock()
    gate = PeerGate(KEY, "server-1", clock=clock)
    _, token, opened = handshake(gate)
    assert opened and gate.admits(token) and gate.sessions() == ["a"]
    clock.now += peer_auth.SESSION_SECONDS + 1
    assert not gate.admits(token) and gate.sessions() == []


def test_a_server_without_a_usable_key_takes_no_peers():
    assert not PeerGate(None, "x").open
    assert not PeerGate("short", "x").open
    assert "shorter than 16" in (peer_auth.key_problem("short") or "")
    assert "not set" in (peer_auth.key_problem(None) or "")
    assert peer_auth.key_problem(KEY) is None


def test_challenge_nonce_checked():
    gate = PeerGate(KEY, "x")
    for bad in ("", "xyz", 42, None, "A" * 32):
        with pytest.raises(ValueError, match="client_nonce"):
            gate.challenge(bad, ADDRESS)


def test_addresses_written_alike():
    assert peer_auth.address_text("10.0.0.3", 13305) == "10.0.0.3:13305"
    assert peer_auth.address_text("::1", 80) == "[::1]:80"
    assert peer_auth.address_text("[fd00:0::2]", 80) == "[fd00::2]:80"


def peer(url: str, models: tuple[str, ...], loaded: tuple[str, ...] = (), state: str = "up") -> Peer:
    return Peer(url, state=state, token="t" if state == "up" else None, models={m: {"id": m} for m in models},
                loaded=frozenset(loaded))


def test_where_a_request_goes():
    b = peer("http://b", ("gemma", "minilm"), loaded=("minilm",))
    c = peer("http://c", ("gemma",), loaded=("gemma",))
    d = peer("http://d", ("gemma",), loaded=("gemma",), state="down")
    peers = [b, c, d]
    assert targets("gemma", here=True, loaded_here=True, peers=peers) == []  # loaded here: served here
    assert targets("gemma", here=True, loaded_here=False, peers=peers) == [c]  # here, not loaded: a loaded peer
    assert targets("minilm", here=True, loaded_here=False, peers=peers) == [b]
    assert targets("gemma", here=False, loaded_here=False, peers=peers) == [c, b]  # not here: loaded ones first
    assert targets("qwen", here=False, loaded_here=False, peers=peers) == []
    b.models.pop("minilm")
    assert targets("minilm", here=True, loaded_here=False, peers=peers) == []  # only here: served here
    refused = peer("http://e", ("gemma",), loaded=("gemma",), state="refused")
    assert targets("gemma", here=False, loaded_here=False, peers=[refused]) == []


def test_the_peers_setting(tmp_path):
    env = Config(tmp_path, environ={"LEMONADE_PEERS": "http://10.0.0.2:13305/api/v1/, https://gpu.lan"})
    assert env.get("peers") == ["http://10.0.0.2:13305", "https://gpu.lan"]
    assert Config(tmp_path, environ={"LEMONADE_PEERS": "auto"}).get("peers") == "auto"
    assert Config(tmp_path, environ={}).get("peers") == []
    for bad, named in (("everyone", '"everyone"'), (["ftp://10.0.0.2"], "ftp://10.0.0.2"),
                       (["http://10.0.0.2:99999"], "99999"), ([7], "7")):
        with pytest.raises(ConfigError, match="peers") as refused:
            Config(tmp_path, environ={}).set({"peers": bad})
        assert named in str(refused.value)
    assert not (tmp_path / "config.json").exists()


def test_auto_keeps_only_beacons_sent_from_the_address_they_name():
    """`peers: "auto"` hears server beacons; one naming an address other than its sender's (a forged
    pointer at another host) is dropped, so the server never sends that host a challenge."""
    import asyncio
    import socket

    from lemonade.beacon import BeaconListener, encode

    async def scenario() -> list[str]:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        listener = BeaconListener(port)
        task = asyncio.ensure_future(listener.run())
        await asyncio.sleep(0.2)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for url in ("http://127.0.0.1:13305/api/v1/", "http://10.9.8.7:13305/api/v1/"):
            sender.sendto(encode("h", url), ("127.0.0.1", port))
        sender.close()
        await asyncio.sleep(0.2)
        task.cancel()
        return [b.base_url for b in listener.recent(60)]

    assert asyncio.run(scenario()) == ["http://127.0.0.1:13305"]
