"""The engines this build ships: one folder of `backends/` each, named here once.

Adding an engine is a folder `backends/<name>/` holding `descriptor.py` (its `DESCRIPTOR`: backends,
config section, keys, flags; backends/descriptor.py) and `engine.py` (the `Engine` subclass the
descriptor names), plus its name in `ENGINES`. Config defaults and checks (config.py), the
`lemonade serve` and `lemonade load` flags, the engine's backends and its load options and their
checks are derived from the descriptor; the engine registry (backends/registry.py) takes the classes
from the same list, and tests/unit/test_engine_descriptors.py proves it for every engine named here.
"""

from __future__ import annotations

from importlib import import_module

from lemonade.backends.descriptor import Descriptor

# In the order `/v1/system-info` lists the recipes (and config its sections).
ENGINES = ("llamacpp", "fasterwhisper", "whispercpp", "kokoro", "piper", "sdcpp", "onnxruntime", "cloud", "peer",
           "vllm")

DESCRIPTORS: dict[str, Descriptor] = {
    name: import_module(f"lemonade.backends.{name}.descriptor").DESCRIPTOR for name in ENGINES}
BY_RECIPE: dict[str, Descriptor] = {d.recipe: d for d in DESCRIPTORS.values()}
BY_SECTION: dict[str, Descriptor] = {d.section: d for d in DESCRIPTORS.values() if d.section}
