"""faster-whisper (in a private venv), as data: the one place its backends, modes and options are written."""

from lemonade.backends.descriptor import Descriptor, ModelOption

DESCRIPTOR = Descriptor(
    recipe="fasterwhisper",
    engine_class="FasterWhisperEngine",
    title="faster-whisper",
    backends=("cpu",),
    modes=("transcription",),
    model_options=(
        ModelOption("fasterwhisper_compute_type", str, "int8 (default), int8_float32, float32 or default", "TYPE",
                    default="int8", choices=("int8", "int8_float32", "float32", "default")),
        ModelOption.threads("fasterwhisper_threads", "CPU threads (0: one per core)"),
    ),
)
