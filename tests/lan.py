"""A LAN on one machine: network namespaces ("hosts") joined by a Linux bridge ("the switch").

Each host is a namespace with one veth pair, its inner end holding `10.78.<subnet>.<n>/24`, its
outer end enslaved to the bridge, which holds `.1` in the root namespace (so the tests reach every
host, and a broadcast such as a discovery beacon reaches every host, as on a real LAN). Traffic goes
only between these addresses and loopback. Names carry the test process's pid; `Lan.destroy`
removes the links, the bridge and the namespaces by name, and is run by the fixtures' finalizers,
also when a test fails. Needs root and iproute2 (`lan_unusable` says why not, for a skip).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.netns import ip, netns_usable


def lan_unusable(tag: str) -> str | None:
    """Why this machine cannot make the LAN, or None: namespaces (tests/netns.py) and a bridge."""
    reason = netns_usable()
    if reason:
        return reason
    made = ip("link", "add", f"{tag}pb", "type", "bridge", check=False)
    if made.returncode != 0:
        return f"`ip link add ... type bridge` fails here: {made.stderr.strip()}"
    ip("link", "del", f"{tag}pb", check=False)
    return None


@dataclass
class Host:
    ns: str
    address: str
    outer: str


@dataclass
class Lan:
    tag: str  # prefix of every name made (interface names: at most 15 characters)
    subnet: int  # 10.78.<subnet>.0/24
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def gateway(self) -> str:
        return f"10.78.{self.subnet}.1"

    def create(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "brd", "+", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_host(self) -> Host:
        n = len(self.hosts) + 2
        host = Host(f"{self.tag}h{n}", f"10.78.{self.subnet}.{n}", f"{self.tag}o{n}")
        self.hosts.append(host)
        inner = f"{self.tag}i{n}"
        ip("netns", "add", host.ns)
        ip("link", "add", host.outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", host.ns)
        ip("link", "set", host.outer, "master", self.bridge)
        ip("link", "set", host.outer, "up")
        ip("-n", host.ns, "addr", "add", f"{host.address}/24", "brd", "+", "dev", inner)  # a LAN's broadcast address
        ip("-n", host.ns, "link", "set", inner, "up")
        ip("-n", host.ns, "link", "set", "lo", "up")
        return host

    def destroy(self) -> None:
        for host in self.hosts:
            ip("link", "del", host.outer, check=False)  # takes its inner end along
            ip("netns", "del", host.ns, check=False)
        ip("link", "del", self.bridge, check=False)
