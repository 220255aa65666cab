"""Piper (in a private venv), as data: the one place its backends and modes are written."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="piper", engine_class="PiperEngine", title="Piper", backends=("cpu",), modes=("tts",))
