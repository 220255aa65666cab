"""The job recipe expression language (upstream `docs/dev/job-expression-language.md`).

Two things are evaluated against a job's context (the JSON object of step outputs, extracted keys
and `inputs`): `${path}` references in a step's `params`, and the boolean conditions of `when` and
`branch[].when`. The language is deliberately tiny (literals, references, comparisons, boolean
logic, arithmetic) and pure: nothing here touches the server, so it is tested table by table
(tests/test_job_expr.py). Conditions are parsed into a small tree once; `&&`/`||` evaluate both
sides (as upstream documents), so a guard never hides a bad reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class ExprError(ValueError):
    """A syntax error, an unknown reference, or a type error; the message says which."""


# ----- references ------------------------------------------------------------------------------

def resolve_path(path: str, context: Any) -> Any:
    """The value at a dotted path: each segment an object key, or an index into an array."""
    if not path:
        raise ExprError("empty reference '${}'")
    value = context
    walked: list[str] = []
    for segment in path.split("."):
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            where = ".".join(walked) or "the context"
            raise ExprError(f"unknown reference '${{{path}}}': no '{segment}' in {where}")
        walked.append(segment)
    return value


def stringify(value: Any) -> str:
    """How a value reads inside text: strings as they are, null as nothing, the rest as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


_WHOLE_REF = re.compile(r"\$\{([^{}]*)\}")


def _refs_in(text: str) -> list[tuple[int, int, str]]:
    """(start, end, path) of each `${...}` in `text`; an unterminated one is an error."""
    found = []
    pos = 0
    while (start := text.find("${", pos)) >= 0:
        end = text.find("}", start + 2)
        if end < 0:
            raise ExprError(f"unterminated reference in '{text}': '${{' without '}}'")
        found.append((start, end + 1, text[start + 2:end]))
        pos = end + 1
    return found


def check_refs(value: Any) -> None:
    """Creation-time check of a params value: every `${` is closed (paths are checked at run time)."""
    if isinstance(value, str):
        _refs_in(value)
    elif isinstance(value, dict):
        for item in value.values():
            check_refs(item)
    elif isinstance(value, list):
        for item in value:
            check_refs(item)


def resolve_refs(value: Any, context: Any) -> Any:
    """`value` with its references resolved: a string that is exactly one reference takes the
    referenced value with its JSON type; references inside text are interpolated as text."""
    if isinstance(value, dict):
        return {k: resolve_refs(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, context) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value
    refs = _refs_in(value)
    if len(refs) == 1 and refs[0][0] == 0 and refs[0][1] == len(value):
        return resolve_path(refs[0][2], context)
    out, pos = [], 0
    for start, end, path in refs:
        out.append(value[pos:start])
        out.append(stringify(resolve_path(path, context)))
        pos = end
    out.append(value[pos:])
    return "".join(out)


# ----- conditions: tokens ----------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    kind: str  # num, str, ref, kw, op, end
    value: Any
    pos: int


_OPERATORS = ("||", "&&", "==", "!=", "<=", ">=", "<", ">", "!", "+", "-", "*", "/", "(", ")")
_NUMBER = re.compile(r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = {"true": True, "false": False, "null": None}


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if text.startswith("${", i):
            end = text.find("}", i + 2)
            if end < 0:
                raise ExprError(f"unterminated reference at position {i}: '${{' without '}}'")
            path = text[i + 2:end].strip()
            if not path:
                raise ExprError(f"empty reference '${{}}' at position {i}")
            tokens.append(Token("ref", path, i))
            i = end + 1
            continue
        if ch in "'\"":
            j, chars = i + 1, []
            while j < n and text[j] != ch:
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                chars.append(text[j])
                j += 1
            if j >= n:
                raise ExprError(f"unterminated string literal at position {i}")
            tokens.append(Token("str", "".join(chars), i))
            i = j + 1
            continue
        if ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _NUMBER.match(text, i)
            assert m is not None
            literal = m.group(0)
            number = float(literal) if any(c in literal for c in ".eE") else int(literal)
            tokens.append(Token("num", number, i))
            i = m.end()
            continue
        if m := _WORD.match(text, i):
            word = m.group(0)
            if word not in _KEYWORDS:
                raise ExprError(f"unknown identifier '{word}' at position {i} (only true, false and null are "
                                "keywords; context values are read as ${path})")
            tokens.append(Token("kw", _KEYWORDS[word], i))
            i = m.end()
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                tokens.append(Token("op", op, i))
                i += len(op)
                break
        else:
            raise ExprError(f"unexpected character '{ch}' at position {i}")
    tokens.append(Token("end", None, n))
    return tokens


# ----- conditions: parsing into a tree -----------------------------------------------------------
# A node is a tuple: ("lit", value) | ("ref", path) | ("not", node) | ("neg", node) | (op, left, right).

Node = tuple[Any, ...]
_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take_op(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok.kind == "op" and tok.value in ops:
            self.i += 1
            return str(tok.value)
        return None

    def parse(self) -> Node:
        if self.peek().kind == "end":
            return ("lit", True)  # an empty condition is true
        node = self.or_()
        tok = self.peek()
        if tok.kind != "end":
            raise ExprError(f"unexpected {_describe(tok)} at position {tok.pos}")
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.take_op("||"):
            node = ("||", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.take_op("&&"):
            node = ("&&", node, self.not_())
        return node

    def not_(self) -> Node:
        if self.take_op("!"):
            return ("not", self.not_())
        return self.comparison()

    def comparison(self) -> Node:
        node = self.additive()
        if op := self.take_op(*_COMPARISONS):
            node = (op, node, self.additive())
            tok = self.peek()
            if tok.kind == "op" and tok.value in _COMPARISONS:
                raise ExprError(f"comparisons do not chain ('{tok.value}' at position {tok.pos}); combine them "
                                "with && instead")
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while op := self.take_op("+", "-"):
            node = (op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while op := self.take_op("*", "/"):
            node = (op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.take_op("-"):
            return ("neg", self.unary())
        return self.primary()

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind in ("num", "str", "kw"):
            self.i += 1
            return ("lit", tok.value)
        if tok.kind == "ref":
            self.i += 1
            return ("ref", tok.value)
        if self.take_op("("):
            node = self.or_()
            if not self.take_op(")"):
                got = self.peek()
                raise ExprError(f"expected ')' at position {got.pos}, found {_describe(got)}")
            return node
        raise ExprError(f"expected a value at position {tok.pos}, found {_describe(tok)}")


def _describe(tok: Token) -> str:
    return "the end of the expression" if tok.kind == "end" else f"'{tok.value}'" if tok.kind == "op" else \
        f"{tok.kind} {json.dumps(tok.value)}"


def parse(text: str) -> Node:
    """The tree of a condition; ExprError on a syntax error (what job creation checks)."""
    return _Parser(text).parse()


# ----- conditions: evaluation ------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def truthy(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if _is_number(v):
        return v != 0
    if isinstance(v, str | list | dict):
        return len(v) > 0
    return False


def json_equal(a: Any, b: Any) -> bool:
    """Deep JSON equality: by value and type (2 == 2.0, but 1 != '1' and 1 != true)."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if _is_number(v):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(v), type(v).__name__)


def _number(op: str, v: Any) -> float | int:
    if not _is_number(v):
        raise ExprError(f"'{op}' needs numbers, got {_type_name(v)} {json.dumps(v)}")
    return v


def evaluate(node: Node, context: Any) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "ref":
        return resolve_path(node[1], context)
    if kind == "not":
        return not truthy(evaluate(node[1], context))
    if kind == "neg":
        return -_number("-", evaluate(node[1], context))
    left, right = evaluate(node[1], context), evaluate(node[2], context)  # both sides, always
    if kind == "||":
        return truthy(left) or truthy(right)
    if kind == "&&":
        return truthy(left) and truthy(right)
    if kind == "==":
        return json_equal(left, right)
    if kind == "!=":
        return not json_equal(left, right)
    if kind in ("<", "<=", ">", ">="):
        if not ((_is_number(left) and _is_number(right)) or (isinstance(left, str) and isinstance(right, str))):
            raise ExprError(f"cannot order {_type_name(left)} {json.dumps(left)} and {_type_name(right)} "
                            f"{json.dumps(right)} with '{kind}' (two numbers or two strings only)")
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[kind]
    a, b = _number(kind, left), _number(kind, right)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    if b == 0:
        raise ExprError("division by zero")
    return a / b


def eval_condition(text: str | None, context: Any) -> bool:
    """A `when`: empty (or absent) is true; otherwise the truthiness of its value."""
    if not text or not text.strip():
        return True
    return truthy(evaluate(parse(text), context))
