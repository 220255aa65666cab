"""OpenAI-compatible cloud providers, as data: the one place its backends and modes are written."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="cloud", engine_class="CloudEngine", title="cloud providers", backends=("cloud",),
                        modes=("chat", "embeddings"))
