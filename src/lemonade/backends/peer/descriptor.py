"""Another Lemonade server of the LAN, as data: the one place its backends and modes are written."""

from lemonade.backends.descriptor import Descriptor

# whatever the peer serves
DESCRIPTOR = Descriptor(recipe="peer", engine_class="PeerEngine", title="LAN peers", backends=("peer",),
                        modes=("chat", "embeddings", "reranking", "transcription", "tts", "image", "classification"))
