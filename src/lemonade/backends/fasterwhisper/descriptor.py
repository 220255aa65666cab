"""faster-whisper (in a private venv), as data: the one place its backends and modes are written."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="fasterwhisper", engine_class="FasterWhisperEngine", title="faster-whisper",
                        backends=("cpu",), modes=("transcription",))
