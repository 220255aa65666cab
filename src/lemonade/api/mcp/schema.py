"""Checking tool arguments against the JSON Schemas we publish in `tools/list`.

Our schemas use a small part of JSON Schema (type, properties, required, enum, minimum, maximum,
items, minItems, minLength), so a small checker keeps the server free of another dependency while
giving the caller a message that names the argument. Arguments the schema does not list are
ignored, as MCP clients sometimes add their own.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,), "object": (dict,), "array": (list,)}


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, (object,)))


def errors(value: Any, schema: dict[str, Any], where: str = "arguments") -> list[str]:
    """Every problem found, each naming its place (`messages[0]`, `n`, ...)."""
    out: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        wanted = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_type_ok(value, k) for k in wanted):
            return [f"`{where}` must be of type {' or '.join(wanted)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"`{where}` must be one of {', '.join(repr(v) for v in schema['enum'])}, got {value!r}"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"`{where}` must be >= {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"`{where}` must be <= {schema['maximum']}, got {value}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        out.append(f"`{where}` must not be empty" if schema["minLength"] == 1
                   else f"`{where}` must be at least {schema['minLength']} characters")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"`{where}` must have at least {schema['minItems']} item(s)")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                out += errors(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"missing required argument `{name}`" if where == "arguments"
                           else f"`{where}.{name}` is required")
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and isinstance(sub, dict):
                out += errors(value[name], sub, name if where == "arguments" else f"{where}.{name}")
    return out
