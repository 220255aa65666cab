"""faster-whisper, as data: the one place its backends are written (it has no config section)."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="fasterwhisper", engine_class="FasterWhisperEngine", title="faster-whisper",
                        backends=("cpu",))
