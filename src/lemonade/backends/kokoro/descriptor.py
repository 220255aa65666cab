"""Kokoro (kokoro-onnx in a private venv), as data: the one place its backends, config keys and options are written."""

from lemonade.backends.descriptor import BinRule, Descriptor, ModelOption

DESCRIPTOR = Descriptor(
    recipe="kokoro",
    engine_class="KokoroEngine",
    title="Kokoro",
    backends=("cpu",),
    modes=("tts",),
    section="kokoro",
    model_options=(ModelOption.threads("kokoro_threads", "ONNX Runtime threads of Kokoro (0: one per core)"),),
    panel="Text-to-Speech Options",
    bins=("cpu",),  # upstream's key, kept so a migrated config.json keeps it
    bin_rule=BinRule(None, "kokoro", only_builtin="Kokoro runs on kokoro-onnx in a private Python environment in "
                     "this Lemonade, not on a binary of yours"),
)
