"""The job expression language (src/lemonade/jobs/expr.py), table by table, as upstream's
docs/dev/job-expression-language.md describes it: references, interpolation, conditions (literals,
precedence, truthiness, comparison and arithmetic rules) and every documented error. Pure: no server.
"""

from __future__ import annotations

import pytest

from lemonade.jobs.expr import ExprError, eval_condition, evaluate, parse, resolve_path, resolve_refs
from lemonade.jobs.records import GraphError, parse_definition

CTX = {
    "inputs": {"model": "Qwen3-0.6B", "ctx": 32768, "prompt": [{"role": "user", "content": "hi"}]},
    "run_v": {"timings": {"predicted_per_second": 41.5, "prompt_ms": 12}},
    "vulkan_tps": 41.5, "rocm_tps": 38, "winner": "vulkan", "list": [10, 20, 30], "empty": [], "obj": {},
    "zero": 0, "none": None, "flag": True, "text": "", "q": "it's",
}

# ----- references -------------------------------------------------------------------------------

PATHS = [
    ("inputs.model", "Qwen3-0.6B"),
    ("run_v.timings.predicted_per_second", 41.5),
    ("list.0", 10),
    ("list.2", 30),
    ("inputs.prompt.0.content", "hi"),
    ("none", None),
]


@pytest.mark.parametrize("path,value", PATHS)
def test_resolve_path(path, value):
    assert resolve_path(path, CTX) == value


@pytest.mark.parametrize("path", ["nope", "inputs.nope", "list.3", "list.x", "run_v.timings.prompt_ms.deeper", ""])
def test_unknown_path_is_an_error(path):
    with pytest.raises(ExprError):
        resolve_path(path, CTX)


REFS = [
    ("${inputs.ctx}", 32768),                                   # whole-string: keeps the type
    ("${inputs.prompt}", [{"role": "user", "content": "hi"}]),
    ("${flag}", True),
    ("${none}", None),
    ("vulkan @ ${inputs.ctx} tok", "vulkan @ 32768 tok"),       # embedded: text
    ("${winner}${rocm_tps}", "vulkan38"),                       # two references: text
    ("[${none}]", "[]"),                                        # null reads as nothing
    ("t=${flag} ${run_v.timings.predicted_per_second}", "t=true 41.5"),
    ("l=${list} o=${obj}", "l=[10,20,30] o={}"),                 # compact JSON
    ("no refs", "no refs"),
    ({"a": ["${inputs.model}", {"b": "${list.1}"}], "n": 3}, {"a": ["Qwen3-0.6B", {"b": 20}], "n": 3}),
]


@pytest.mark.parametrize("value,expected", REFS)
def test_resolve_refs(value, expected):
    assert resolve_refs(value, CTX) == expected


@pytest.mark.parametrize("value", ["${inputs.model", "x ${nope} y", "${}"])
def test_bad_refs_in_params(value):
    with pytest.raises(ExprError):
        resolve_refs(value, CTX)


# ----- conditions -------------------------------------------------------------------------------

CONDITIONS = [
    ("", True),                                    # empty is true
    ("   ", True),
    ("true", True), ("false", False), ("null", False),
    ("42", True), ("0", False), (".5", True), ("3.14 > 3", True),
    ("'vulkan'", True), ("''", False), ('"q8_0" == \'q8_0\'', True),
    ("'it\\'s' == ${q}", True),                    # backslash escapes the next character
    ("${vulkan_tps} > ${rocm_tps}", True),
    ("${winner} == 'vulkan'", True), ("${winner} != 'vulkan'", False),
    ("2 == 2.0", True), ("1 == '1'", False), ("1 == true", False), ("null == null", True),
    ("${list} == ${list}", True), ("${obj} == ${empty}", False),
    ("${empty}", False), ("${obj}", False), ("${list}", True), ("${text}", False), ("${zero}", False),
    ("'a' < 'b'", True), ("'b' <= 'a'", False), ("10 >= 10", True),
    ("10 / 4 == 2.5", True), ("1 + 2 * 3 == 7", True), ("(1 + 2) * 3 == 9", True), ("7 - 2 - 1 == 4", True),
    ("-3 + 5 == 2", True), ("--3 == 3", True), ("-${rocm_tps} < 0", True),
    ("${run_v.timings.prompt_ms} / ${zero} > 1 || true", None),  # not short-circuit: division by zero raises
    ("true || false && false", True),              # && binds tighter than ||
    ("(true || false) && false", False),
    ("!false", True), ("!!${flag}", True), ("!${vulkan_tps} > 100", True),   # ! binds looser than comparison
    ("!(1 == 1) || 1 < 2", True),
    ("${flag} && ${winner}", True),
    ("${vulkan_tps} / ${rocm_tps} > 1.05", True),
]


@pytest.mark.parametrize("text,expected", CONDITIONS)
def test_conditions(text, expected):
    if expected is None:
        with pytest.raises(ExprError):
            eval_condition(text, CTX)
    else:
        assert eval_condition(text, CTX) is expected


def test_arithmetic_values():
    assert evaluate(parse("10 / 4"), CTX) == 2.5
    assert evaluate(parse("${list.1} * 2 - 1"), CTX) == 39


SYNTAX_ERRORS = [
    ("1 < 2 < 3", "do not chain"),
    ("${a", "unterminated reference"),
    ("'abc", "unterminated string"),
    ("foo == 1", "unknown identifier 'foo'"),
    ("True", "unknown identifier"),
    ("1 = 1", "unexpected character '='"),
    ("a & b", "unknown identifier"),
    ("1 & 2", "unexpected character '&'"),
    ("1 2", "unexpected"),
    ("(1 + 2", r"expected '\)'"),
    ("1 +", "expected a value"),
    ("1 + !true", "expected a value"),
    ("${}", "empty reference"),
    ("#", "unexpected character '#'"),
]


@pytest.mark.parametrize("text,message", SYNTAX_ERRORS)
def test_syntax_errors(text, message):
    with pytest.raises(ExprError, match=message):
        parse(text)


RUNTIME_ERRORS = [
    ("${no.such.key} > 0", "unknown reference"),
    ("${winner} > 1", "cannot order"),
    ("'a' + 1", "needs numbers"),
    ("true * 2", "needs numbers"),
    ("-'x'", "needs numbers"),
    ("1 / 0", "division by zero"),
    ("${none} != null && ${none.b} > 0", "unknown reference"),   # both sides are evaluated
]


@pytest.mark.parametrize("text,message", RUNTIME_ERRORS)
def test_runtime_errors(text, message):
    parse(text)  # syntactically fine: only evaluation fails
    with pytest.raises(ExprError, match=message):
        eval_condition(text, CTX)


# ----- step graphs (creation-time validation) ---------------------------------------------------

OPS = {"load", "unload", "chat", "sleep", "models", "system_info", "system_stats"}


def steps(*items):
    return {"name": "t", "steps": list(items)}


GRAPHS = [
    ({"name": "t"}, "missing 'steps'"),
    (steps(), "non-empty array"),
    ({"steps": [{"id": "a", "op": "sleep"}], "inputs": [1]}, "'inputs' must be an object"),
    ({"definition": {"nosteps": []}}, "'definition' must be an object with 'steps'"),
    (steps("x"), r"steps\[0\] must be an object"),
    (steps({"op": "sleep"}), r"steps\[0\]\.id must be a non-empty string"),
    (steps({"id": "a", "op": "sleep"}, {"id": "a", "op": "sleep"}), r"steps\[1\] \('a'\)\.id: duplicate"),
    (steps({"id": "inputs", "op": "sleep"}), "reserved"),
    (steps({"id": "a.b", "op": "sleep"}), "must not contain"),
    (steps({"id": "a", "op": "fly"}), r"steps\[0\] \('a'\)\.op: unknown op 'fly'"),
    (steps({"id": "a", "op": "sleep", "param": {}}), r"unknown field\(s\) 'param'"),
    (steps({"id": "a", "op": "sleep", "params": [1]}), r"\.params must be an object"),
    (steps({"id": "a", "op": "sleep", "params": {"ms": "${x"}}), r"\.params: unterminated reference"),
    (steps({"id": "a", "op": "sleep", "when": "1 < 2 < 3"}), r"steps\[0\] \('a'\)\.when: invalid expression"),
    (steps({"id": "a", "op": "sleep", "when": 5}), r"\.when must be a string"),
    (steps({"id": "a", "op": "sleep", "branch": [{"when": "true"}]}, {"id": "b", "op": "sleep"}),
     r"branch\[0\]\.goto is required"),
    (steps({"id": "a", "op": "sleep", "branch": [{"when": "x", "goto": "b"}]}, {"id": "b", "op": "sleep"}),
     r"branch\[0\]\.when: invalid expression"),
    (steps({"id": "a", "op": "sleep", "branch": [{"when": "true", "goto": "zz"}]}), r"branch\[0\]\.goto: 'zz' is not"),
    (steps({"id": "a", "op": "sleep"}, {"id": "b", "op": "sleep", "on_done": "a"}),
     r"steps\[1\] \('b'\)\.on_done: 'a' is not a later step"),
    (steps({"id": "a", "op": "sleep", "on_fail": "a"}), r"on_fail: 'a' is not a later step"),
    (steps({"id": "a", "op": "sleep", "on_fail": "retry"}), r"on_fail: 'retry' is not a step id of this job"),
    (steps({"id": "a", "op": "sleep", "extract": {"x": 1}}), r"\.extract must map"),
    (steps({"id": "a", "op": "sleep", "extract": {"a": "b"}}), "also a step id"),
]


@pytest.mark.parametrize("body,message", GRAPHS)
def test_invalid_graphs(body, message):
    with pytest.raises(GraphError, match=message):
        parse_definition(body, OPS)


def test_valid_graph_both_shapes():
    body = {"name": "n", "inputs": {"m": 1},
            "definition": {"steps": [{"id": "a", "op": "sleep", "branch": [{"when": "${m} > 0", "goto": "c"}],
                                      "on_fail": "continue"},
                                     {"id": "b", "op": "sleep", "on_done": "c"}, {"id": "c", "op": "models"}]}}
    name, parsed, inputs = parse_definition(body, OPS)
    assert (name, [s.id for s in parsed], inputs) == ("n", ["a", "b", "c"], {"m": 1})
    _, parsed, _ = parse_definition({"steps": body["definition"]["steps"]}, OPS)
    assert parsed[0].branch == [{"when": "${m} > 0", "goto": "c"}]
