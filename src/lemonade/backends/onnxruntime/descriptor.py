"""ONNX Runtime classifiers (in a private venv), as data: the one place its backends, modes and options are
written."""

from lemonade.backends.descriptor import Descriptor, ModelOption

DESCRIPTOR = Descriptor(
    recipe="onnxruntime",
    engine_class="OnnxRuntimeEngine",
    title="ONNX Runtime",
    backends=("cpu",),
    modes=("classification",),
    model_options=(
        ModelOption.threads("onnxruntime_threads", "ONNX Runtime threads of a classifier (0: one per core)"),
    ),
)
