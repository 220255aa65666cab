"""ONNX Runtime classifiers (in a private venv), as data: the one place its backends, modes and options are
written."""

from lemonade.backends.descriptor import Descriptor, ModelOption, check_threads

DESCRIPTOR = Descriptor(
    recipe="onnxruntime",
    engine_class="OnnxRuntimeEngine",
    title="ONNX Runtime",
    backends=("cpu",),
    modes=("classification",),
    model_options=(ModelOption("onnxruntime_threads", int, "ONNX Runtime threads of a classifier (0: one per core)",
                               "N", default=0, check=check_threads),),
)
