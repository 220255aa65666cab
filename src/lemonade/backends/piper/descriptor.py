"""Piper (in a private venv), as data: the one place its backends, modes and options are written."""

from lemonade.backends.descriptor import Descriptor, ModelOption, check_threads

DESCRIPTOR = Descriptor(
    recipe="piper",
    engine_class="PiperEngine",
    title="Piper",
    backends=("cpu",),
    modes=("tts",),
    model_options=(ModelOption("piper_threads", int, "ONNX Runtime threads of Piper (0: one per core)", "N",
                               default=0, check=check_threads),),
    panel="Text-to-Speech Options",
)
