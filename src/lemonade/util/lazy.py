"""Modules imported when first used: what keeps the `lemonade` command quick to start.

`lemonade --help` lists every command, so it imports every command's module; those import httpx
(and `stop`'s psutil) for the requests they send, which `--help` never does. Such a module names
`httpx = lazy_module("httpx")` instead of `import httpx`, and the import happens at the first
`httpx.<name>` (docs/performance.md, "Start-up"). It does so under `if not TYPE_CHECKING`, with a plain
`import httpx` for the type checker, which then sees the real module.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def lazy_module(name: str) -> types.ModuleType:
    """Module `name`, executed on the first access to one of its attributes (the module itself when
    it is imported already). It takes the module's place in `sys.modules`, so every later `import`
    of it gets the same object."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
