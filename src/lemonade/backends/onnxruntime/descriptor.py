"""ONNX Runtime classifiers (in a private venv), as data: the one place its backends and modes are written."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="onnxruntime", engine_class="OnnxRuntimeEngine", title="ONNX Runtime",
                        backends=("cpu",), modes=("classification",))
