"""cloud providers, as data: the one place its backends are written (it has no config section)."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="cloud", engine_class="CloudEngine", title="cloud providers", backends=("cloud",))
