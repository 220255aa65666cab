"""ONNX Runtime, as data: the one place its backends are written (it has no config section)."""

from lemonade.backends.descriptor import Descriptor

DESCRIPTOR = Descriptor(recipe="onnxruntime", engine_class="OnnxRuntimeEngine", title="ONNX Runtime", backends=("cpu",))
