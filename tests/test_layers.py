"""The import graph of `src/lemonade`, read from the code's own import statements, is one-way.

Every `import` and `from ... import` counts: module-level, inside functions, and under
`if TYPE_CHECKING:` too (a type-only import is still one module knowing another; an engine that
names the router in a signature knows the router). Two checks:

- no circle between modules (no strongly connected component of more than one module);
- the top-level packages form layers, lowest first in `LAYERS`: a module imports only from its
  own package or from a package listed before it. An engine does not know the router that drives
  it (what it needs is passed in), the catalog does not ask the engines which modes a recipe serves
  (recipes.py tells both), and the API is above the omni tool loop and the use cases it shares.
  One layer is not a package: what an engine declares as data (`backends/<engine>/descriptor.py`,
  the settings its checks use) sits below config, which derives the engine's settings from it.

A third check is inside `api/`: an API family (`api/<family>/`) borrows no logic from another
family's modules. What two entry points both do (choose and load a model, a model object, a
transcription) is in `serving/`, below every family; across families only the request shapes are
shared (`*protocol` modules), and `api/app.py`, which mounts every family's routes, imports them all.

No server runs here: the source files are parsed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Top-level packages and modules of `lemonade`, lowest layer first. `lemonade` is the package's own
# `__init__` (its version).
LAYERS = (
    "lemonade",
    "errors", "paths", "util", "audio", "system", "routing", "descriptors", "recipes", "route_table",
    "config", "legacy_state",
    "observability", "beacon",
    "labels", "model_info", "checkpoints",
    "catalog",
    "backends",
    "runtime",
    "downloads", "autotune", "jobs", "mcp_client",
    "services",
    "serving", "omni",
    "api",
    "server",
    "cli",
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "lemonade").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line of the first import}, every import statement counted."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [source] + [f"{source}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.split(".")[0] == "lemonade" else None
                if found and found != module:
                    edges.setdefault(found, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# What an engine declares as data: the descriptor type (backends/descriptor.py), the registry of
# descriptors (backends/descriptors.py), each engine folder's descriptor.py and the settings module its
# checks come from. They sit below config, which derives every engine's settings from them, while the
# rest of the engine's folder sits in `backends`.
DESCRIPTOR_MODULES = re.compile(r"lemonade\.backends\.(descriptor|descriptors|\w+\.(descriptor|settings))")


def layer(module: str) -> str:
    if DESCRIPTOR_MODULES.fullmatch(module):
        return "descriptors"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    detail = [
        f"{len(c)} modules: " + "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in c for b in sorted(graph[a])
                                          if b in c)
        for c in found]
    assert not found, "import circles:\n" + "\n".join(detail)


def test_every_package_has_a_layer():
    missing = sorted({layer(m) for m in _modules()} - set(LAYERS))
    assert not missing, f"add these to LAYERS in {__file__}: {missing}"


def test_nothing_imports_upward():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, edges in sorted(import_graph().items()):
        for target, line in sorted(edges.items()):
            if layer(target) != layer(module) and rank.get(layer(target), -1) > rank.get(layer(module), -1):
                upward.append(f"{module} (line {line}) imports {target}")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def family(module: str) -> str | None:
    """The API family of a module of `api/<family>/` (None for every other module)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "api" else None


def borrowed(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports by a module of `api/` (app.py excepted) of another API family's module that is not its
    request shapes (`*protocol`)."""
    found = []
    for module, edges in sorted(graph.items()):
        if not module.startswith("lemonade.api.") or module == "lemonade.api.app":
            continue
        for target, line in sorted(edges.items()):
            other = family(target)
            if other is not None and other != family(module) and not target.endswith("protocol"):
                found.append(f"{module} (line {line}) imports {target}")
    return found


def test_no_api_family_borrows_another_familys_logic():
    found = borrowed(import_graph())
    assert not found, ("imports of another API family's module (move what both need into serving/):\n"
                       + "\n".join(found))


def web_framework_imports(module: str, source: str) -> list[str]:
    """Imports of FastAPI or Starlette in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"{module} (line {node.lineno}) imports {name}" for name in names
                  if name.split(".")[0] in ("fastapi", "starlette")]
    return found


def test_serving_and_runtime_know_no_web_framework():
    """serving/ takes plain values and raises APIError, and the proxy of runtime/ hands over plain values
    (runtime/proxy.py `Relay`): a request or a response is the API's (api/relay.py makes the response)."""
    found = [line for module, path in sorted(_modules().items()) if layer(module) in ("serving", "runtime")
             for line in web_framework_imports(module, path.read_text())]
    assert not found, "serving/ or runtime/ imports a web framework:\n" + "\n".join(found)
    assert web_framework_imports("m", "def f():\n    from starlette.requests import Request\n") == [
        "m (line 2) imports starlette.requests"]


def test_the_family_check_sees_a_borrowed_use_case():
    """What the check was written for: the job ops took `_prepare_load` from Lemonade's load route (its
    own family: allowed) and `chat_model` from OpenAI's inference route (not), beside OpenAI's request
    shapes (allowed); a peer route took `model_object` from OpenAI's models route (not)."""
    graph = {"lemonade.api.lemonade.job_ops": {"lemonade.api.lemonade.load": 22, "lemonade.api.openai.inference": 24,
                                               "lemonade.api.openai.protocol": 26},
             "lemonade.api.peers": {"lemonade.api.openai.models": 25},
             "lemonade.api.app": {"lemonade.api.openai.inference": 49}}
    assert borrowed(graph) == ["lemonade.api.lemonade.job_ops (line 24) imports lemonade.api.openai.inference",
                               "lemonade.api.peers (line 25) imports lemonade.api.openai.models"]


def test_the_check_sees_function_level_and_type_checking_imports():
    """The graph counts an import inside a function and one under TYPE_CHECKING (a check that missed
    them would pass whatever the code does)."""
    graph = import_graph()
    # backends/engine.py imports config under TYPE_CHECKING only; server.py imports the app in a function
    assert "lemonade.config" in graph["lemonade.backends.engine"]
    assert "lemonade.api.app" in graph["lemonade.server"]
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
