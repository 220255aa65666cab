"""LAN peers, as data: the one place its backends are written (it has no config section)."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="peer", engine_class="PeerEngine", title="LAN peers", backends=("peer",))
