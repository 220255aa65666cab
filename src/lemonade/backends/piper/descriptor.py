"""Piper, as data: the one place its backends are written (it has no config section)."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="piper", engine_class="PiperEngine", title="Piper", backends=("cpu",))
