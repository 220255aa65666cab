"""Piper (in a private venv), as data: the one place its backends, modes and options are written."""

from lemonade.backends.descriptor import Descriptor, ModelOption

DESCRIPTOR = Descriptor(
    recipe="piper",
    engine_class="PiperEngine",
    title="Piper",
    backends=("cpu",),
    modes=("tts",),
    model_options=(ModelOption.threads("piper_threads", "ONNX Runtime threads of Piper (0: one per core)"),),
    panel="Text-to-Speech Options",
)
