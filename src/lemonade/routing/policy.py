"""A `collection.router` policy: its validation and its parsed form (docs/routing.md).

A policy is checked once, when it is registered, so a request never meets a malformed one: every
problem is a `PolicyError` whose message starts with the path of the field at fault
(`routing.rules[2].match.any[0].regex must be ...`). Names of models are compared by the bare name
(`user.Small` and `Small` are one component), because the catalog stores embedded components
under `user.` while the policy may name them without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "1"
MAX_DEPTH = 64
CLASSIFIER_TYPES = ("classifier", "semantic_similarity", "llm")
# The deterministic leaf operators, in the order an implicit `all` (a leaf object with several keys)
# evaluates them; the classifier band comes first. Same order as Lemonade's engine, so traces agree.
DETERMINISTIC_OPS = ("has_images", "has_tools", "keywords_all", "keywords_any", "max_chars", "metadata",
                     "min_chars", "regex")
MATCH_KEYS = {"any", "all", "not", "classifier", "label", "min_score", "max_score", *DETERMINISTIC_OPS}
ROUTING_KEYS = {"candidates", "default_model", "router", "classifiers", "rules"}
RULE_KEYS = {"id", "match", "route_to", "outputs"}
CLASSIFIER_KEYS = {"id", "type", "model", "prompt", "labels", "default_label", "reference_phrases", "on_error"}
ROUTER_KEYS = {"type", "model", "prompt"}
METADATA_KEYS = {"key", "equals", "any", "exists"}
RULE_ID = re.compile(r"[A-Za-z0-9._-]+")
ROUTER_CLASSIFIER = "__router"


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the field (a JSON path) and the problem."""


# ----- the parsed form ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Keywords:
    words: tuple[str, ...]     # ASCII-lowered
    require_all: bool

    @property
    def op(self) -> str:
        return "keywords_all" if self.require_all else "keywords_any"


@dataclass(frozen=True)
class Regex:
    pattern: re.Pattern[str]
    op: str = "regex"


@dataclass(frozen=True)
class Chars:
    op: str                    # min_chars | max_chars
    limit: int


@dataclass(frozen=True)
class Feature:
    op: str                    # has_tools | has_images
    expected: bool


@dataclass(frozen=True)
class Metadata:
    key: str
    comparator: str            # equals | any | exists
    equals: str = ""
    any_of: frozenset[str] = frozenset()
    exists: bool = False
    op: str = "metadata"


@dataclass(frozen=True)
class Band:
    """A classifier's score for one label, tested against an inclusive [min_score, max_score] band."""

    classifier: str
    label: str | None
    min_score: float | None
    max_score: float | None


@dataclass(frozen=True)
class AllOf:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class AnyOf:
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    child: Node


Node = Keywords | Regex | Chars | Feature | Metadata | Band | AllOf | AnyOf | Not


@dataclass(frozen=True)
class ClassifierDef:
    id: str
    type: str                                   # classifier | semantic_similarity | llm
    model: str
    labels: tuple[str, ...] = ()
    default_label: str | None = None
    match_on_error: bool = False                # on_error: match_true
    prompt: str = ""
    reference_phrases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    id: str
    match: Node
    route_to: str
    outputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    candidates: tuple[str, ...]
    default_model: str
    rules: tuple[Rule, ...]
    classifiers: Mapping[str, ClassifierDef]
    components: tuple[str, ...] = ()
    # The `routing` object as evaluated: `routing.router` desugared into its classifier and rules.
    routing: Mapping[str, Any] = field(default_factory=dict, compare=False)



# ----- validation helpers ------------------------------------------------------------------------

def bare(name: str) -> str:
    """A model name without its source prefix: what policy names are compared by."""
    for prefix in ("user.", "builtin.", "extra."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _obj(value: Any, path: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(f"{path} must be an object")
    unknown = sorted(k for k in value if k not in keys)
    if unknown:
        raise PolicyError(f"{path} has unknown key '{unknown[0]}' (allowed: {', '.join(sorted(keys))})")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{path} must be a non-empty string")
    return value


def _required(obj: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise PolicyError(f"{path + '.' if path else ''}{key} is required")
    return obj[key]


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise PolicyError(f"{path} must be a non-empty array of strings")
    return tuple(_string(v, f"{path}[{i}]") for i, v in enumerate(value))


def _score(leaf: Mapping[str, Any], key: str, path: str) -> float | None:
    if key not in leaf:
        return None
    value = leaf[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"{path}.{key} must be a number from 0 to 1")
    if not 0.0 <= value <= 1.0:
        raise PolicyError(f"{path}.{key} must be from 0 to 1, got {value}")
    return float(value)


_UNBOUNDED = re.compile(r"\*|\+|\{\d*,\}")


def _nested_unbounded(pattern: str) -> bool:
    """A group holding an unbounded quantifier that is itself repeated without bound ((a+)+, (.*)*,
    (\\d+){2,}): the shape that makes a backtracking engine take exponential time on some inputs.
    Policies run on untrusted text, so such a pattern is refused when the policy is registered."""
    groups: list[bool] = []            # per open group: holds an unbounded quantifier
    closed_unbounded = False           # the token just before is a group that held one
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            closed_unbounded = False
            continue
        if c == "[":                   # a character class: quantifier characters are literal inside
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":
                i += 1
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            closed_unbounded = False
            continue
        if c == "(":
            groups.append(False)
            closed_unbounded = False
            i += 1
            continue
        if c == ")":
            inner = groups.pop() if groups else False
            if inner and groups:
                groups[-1] = True
            closed_unbounded = inner
            i += 1
            continue
        quant = _UNBOUNDED.match(pattern, i)
        if quant:
            if closed_unbounded:
                return True
            if groups:
                groups[-1] = True
            i = quant.end()
        elif c == "{":                 # a bounded {m} / {m,n}: skip it
            end = pattern.find("}", i)
            i = end + 1 if end > 0 else i + 1
        else:
            i += 1
        closed_unbounded = False
    return False


# ----- leaves and expressions --------------------------------------------------------------------

def _deterministic(op: str, value: Any, path: str) -> Node:
    where = f"{path}.{op}"
    if op in ("keywords_any", "keywords_all"):
        words = _strings(value, where)
        return Keywords(tuple(ascii_lower(w) for w in words), require_all=op == "keywords_all")
    if op == "regex":
        pattern = _string(value, where)
        if _nested_unbounded(pattern):
            raise PolicyError(f"{where} repeats a group that already holds an unbounded quantifier (like (a+)+), "
                              "which can take exponential time on some inputs; rewrite it without the nesting")
        try:
            return Regex(re.compile(pattern))
        except re.error as exc:
            raise PolicyError(f"{where} is not a valid regular expression: {exc}") from None
    if op in ("min_chars", "max_chars"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PolicyError(f"{where} must be a non-negative integer (a length in UTF-8 bytes)")
        return Chars(op, value)
    if op in ("has_tools", "has_images"):
        if not isinstance(value, bool):
            raise PolicyError(f"{where} must be true or false")
        return Feature(op, value)
    spec = _obj(value, where, METADATA_KEYS)
    key = _string(_required(spec, "key", where), f"{where}.key")
    given = [c for c in ("equals", "any", "exists") if c in spec]
    if len(given) != 1:
        raise PolicyError(f"{where} must have exactly one of 'equals', 'any' or 'exists'"
                          + (f" (has {', '.join(given)})" if given else ""))
    if "equals" in spec:
        if not isinstance(spec["equals"], str):
            raise PolicyError(f"{where}.equals must be a string")
        return Metadata(key, "equals", equals=spec["equals"])
    if "any" in spec:
        return Metadata(key, "any", any_of=frozenset(_strings(spec["any"], f"{where}.any")))
    if not isinstance(spec["exists"], bool):
        raise PolicyError(f"{where}.exists must be true or false")
    return Metadata(key, "exists", exists=spec["exists"])


def _band(leaf: Mapping[str, Any], classifiers: Mapping[str, ClassifierDef], path: str) -> Band:
    cid = _string(leaf["classifier"], f"{path}.classifier")
    if cid not in classifiers:
        known = ", ".join(sorted(classifiers)) or "none are defined"
        raise PolicyError(f"{path}.classifier '{cid}' is not an id of routing.classifiers ({known})")
    clf = classifiers[cid]
    label = None
    if "label" in leaf:
        label = _string(leaf["label"], f"{path}.label")
        if label not in clf.labels:
            raise PolicyError(f"{path}.label '{label}' is not a label of classifier '{cid}' "
                              f"(labels: {', '.join(clf.labels) or 'none declared'})")
    elif clf.labels and clf.default_label is None:
        raise PolicyError(f"{path}.label is required: classifier '{cid}' has several labels and no default_label")
    low, high = _score(leaf, "min_score", path), _score(leaf, "max_score", path)
    if low is not None and high is not None and low > high:
        raise PolicyError(f"{path}.min_score ({low}) is greater than max_score ({high})")
    if low is None and high is None:
        low = 0.5
    return Band(cid, label, low, high)


def _leaf(leaf: Mapping[str, Any], classifiers: Mapping[str, ClassifierDef], path: str) -> Node:
    parts: list[Node] = []
    if "classifier" in leaf:
        parts.append(_band(leaf, classifiers, path))
    else:
        for key in ("label", "min_score", "max_score"):
            if key in leaf:
                raise PolicyError(f"{path}.{key} is only allowed next to 'classifier'")
    parts.extend(_deterministic(op, leaf[op], path) for op in DETERMINISTIC_OPS if op in leaf)
    if not parts:
        raise PolicyError(f"{path} must hold a condition (one of: any, all, not, classifier, "
                          f"{', '.join(DETERMINISTIC_OPS)})")
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def parse_match(expr: Any, classifiers: Mapping[str, ClassifierDef], path: str, depth: int = 0) -> Node:
    if depth > MAX_DEPTH:
        raise PolicyError(f"{path} nests deeper than {MAX_DEPTH} levels")
    expr = _obj(expr, path, MATCH_KEYS)
    logical = [k for k in ("any", "all", "not") if k in expr]
    if len(logical) > 1:
        raise PolicyError(f"{path} has both '{logical[0]}' and '{logical[1]}'; nest them instead")
    if not logical:
        return _leaf(expr, classifiers, path)
    op = logical[0]
    if len(expr) != 1:
        other = next(k for k in expr if k != op)
        raise PolicyError(f"{path} mixes '{op}' with '{other}'; put the condition inside the '{op}'")
    if op == "not":
        return Not(parse_match(expr["not"], classifiers, f"{path}.not", depth + 1))
    children = expr[op]
    if not isinstance(children, list) or not children:
        raise PolicyError(f"{path}.{op} must be a non-empty array of conditions")
    parsed = tuple(parse_match(c, classifiers, f"{path}.{op}[{i}]", depth + 1) for i, c in enumerate(children))
    return AnyOf(parsed) if op == "any" else AllOf(parsed)


# ----- the document ------------------------------------------------------------------------------

def _member(name: Any, path: str, components: set[str] | None) -> str:
    name = _string(name, path)
    if components is not None and bare(name) not in components:
        raise PolicyError(f"{path} '{name}' is not one of the policy's components")
    return name


def _classifier(raw: Any, path: str, components: set[str] | None) -> ClassifierDef:
    raw = _obj(raw, path, CLASSIFIER_KEYS)
    cid = _string(_required(raw, "id", path), f"{path}.id")
    ctype = _string(_required(raw, "type", path), f"{path}.type")
    if ctype not in CLASSIFIER_TYPES:
        raise PolicyError(f"{path}.type '{ctype}' is not one of {', '.join(CLASSIFIER_TYPES)}")
    model = _member(_required(raw, "model", path), f"{path}.model", components)
    on_error = raw.get("on_error", "match_false")
    if on_error not in ("match_true", "match_false"):
        raise PolicyError(f"{path}.on_error must be 'match_true' or 'match_false'")
    labels: tuple[str, ...] = ()
    phrases: dict[str, tuple[str, ...]] = {}
    if ctype == "semantic_similarity":
        if "labels" in raw:
            raise PolicyError(f"{path}.labels is not allowed for semantic_similarity: the concept names are the "
                              "keys of reference_phrases")
        refs = _required(raw, "reference_phrases", path)
        if not isinstance(refs, Mapping) or not refs:
            raise PolicyError(f"{path}.reference_phrases must be an object of concept -> array of phrases")
        phrases = {_string(k, f"{path}.reference_phrases"): _strings(v, f"{path}.reference_phrases.{k}")
                   for k, v in refs.items()}
        labels = tuple(phrases)
    else:
        if "reference_phrases" in raw:
            raise PolicyError(f"{path}.reference_phrases is only for semantic_similarity classifiers")
        if "labels" in raw:
            labels = _strings(raw["labels"], f"{path}.labels")
        elif ctype == "llm":
            raise PolicyError(f"{path}.labels is required for an llm classifier (the labels it chooses from)")
    prompt = ""
    if ctype == "llm":
        prompt = _string(_required(raw, "prompt", path), f"{path}.prompt")
    elif "prompt" in raw:
        raise PolicyError(f"{path}.prompt is only for llm classifiers")
    default = None
    if "default_label" in raw:
        default = _string(raw["default_label"], f"{path}.default_label")
        if default not in labels:
            raise PolicyError(f"{path}.default_label '{default}' is not one of its labels")
    return ClassifierDef(cid, ctype, model, labels, default, on_error == "match_true", prompt, phrases)


def _desugar_router(routing: Mapping[str, Any], candidates: tuple[str, ...],
                    components: set[str] | None) -> dict[str, Any]:
    """`routing.router` (an LLM picks the candidate) is one llm classifier whose labels are the
    candidates plus one rule per candidate; the engine then has a single path."""
    router = _obj(routing["router"], "routing.router", ROUTER_KEYS)
    if _string(_required(router, "type", "routing.router"), "routing.router.type") != "llm":
        raise PolicyError("routing.router.type must be 'llm'")
    for key in ("classifiers", "rules"):
        if key in routing:
            raise PolicyError(f"routing.{key} cannot be combined with routing.router (the router replaces them)")
    out = dict(routing)
    del out["router"]
    model = _member(_required(router, "model", "routing.router"), "routing.router.model", components)
    prompt = _string(_required(router, "prompt", "routing.router"), "routing.router.prompt")
    out["classifiers"] = [{"id": ROUTER_CLASSIFIER, "type": "llm", "model": model, "prompt": prompt,
                           "labels": list(candidates)}]
    out["rules"] = [{"id": f"__route_{i}", "match": {"classifier": ROUTER_CLASSIFIER, "label": c, "min_score": 1.0},
                     "route_to": c} for i, c in enumerate(candidates)]
    return out


def parse_policy(doc: Mapping[str, Any], *, check_components: bool = True) -> Policy:
    """Validate a policy document (`version`, `components`, `routing`; other keys of a model
    definition are the catalog's business) and return its parsed form."""
    if not isinstance(doc, Mapping):
        raise PolicyError("the policy must be a JSON object")
    version = doc.get("version")
    if version != SCHEMA_VERSION:
        raise PolicyError(f"version must be \"{SCHEMA_VERSION}\" (the policy schema this server implements)"
                          + (f", got {version!r}" if version is not None else ""))
    components: set[str] | None = None
    declared: tuple[str, ...] = ()
    if check_components:
        declared = _strings(_required(doc, "components", ""), "components")
        components = {bare(c) for c in declared}
    routing = _obj(_required(doc, "routing", ""), "routing", ROUTING_KEYS)
    raw_candidates = _required(routing, "candidates", "routing")
    if not isinstance(raw_candidates, list) or not raw_candidates:
        raise PolicyError("routing.candidates must be a non-empty array of model names")
    candidates: list[str] = []
    for i, c in enumerate(raw_candidates):
        name = _member(c, f"routing.candidates[{i}]", components)
        if bare(name) in {bare(x) for x in candidates}:
            raise PolicyError(f"routing.candidates[{i}] '{name}' is listed twice")
        candidates.append(name)
    in_candidates = {bare(c) for c in candidates}
    default = _string(_required(routing, "default_model", "routing"), "routing.default_model")
    if bare(default) not in in_candidates:
        raise PolicyError(f"routing.default_model '{default}' must be one of routing.candidates")
    if "router" in routing:
        routing = _desugar_router(routing, tuple(candidates), components)
    raw_classifiers = routing.get("classifiers", [])
    if not isinstance(raw_classifiers, list):
        raise PolicyError("routing.classifiers must be an array")
    classifiers: dict[str, ClassifierDef] = {}
    for i, raw in enumerate(raw_classifiers):
        clf = _classifier(raw, f"routing.classifiers[{i}]", components)
        if clf.id in classifiers:
            raise PolicyError(f"routing.classifiers[{i}].id '{clf.id}' is used twice")
        classifiers[clf.id] = clf
    raw_rules = _required(routing, "rules", "routing")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError("routing.rules must be a non-empty array of rules (or give routing.router instead)")
    rules: list[Rule] = []
    for i, raw in enumerate(raw_rules):
        path = f"routing.rules[{i}]"
        raw = _obj(raw, path, RULE_KEYS)
        rid = _string(_required(raw, "id", path), f"{path}.id")
        if not RULE_ID.fullmatch(rid):
            raise PolicyError(f"{path}.id '{rid}' may only hold letters, digits, '.', '_' and '-' (it is sent as "
                              "the x-lemonade-route header)")
        if any(r.id == rid for r in rules):
            raise PolicyError(f"{path}.id '{rid}' is used by an earlier rule")
        match = parse_match(_required(raw, "match", path), classifiers, f"{path}.match")
        route_to = _string(_required(raw, "route_to", path), f"{path}.route_to")
        if bare(route_to) not in in_candidates:
            raise PolicyError(f"{path}.route_to '{route_to}' must be one of routing.candidates")
        outputs = raw.get("outputs", {})
        if not isinstance(outputs, Mapping):
            raise PolicyError(f"{path}.outputs must be an object")
        rules.append(Rule(rid, match, route_to, dict(outputs)))
    return Policy(tuple(candidates), default, tuple(rules), classifiers, declared, dict(routing))


# The deployment modes (labels.py) a member may have, by what the policy uses it for.
MEMBER_MODES = {"candidate": ("chat",), "classifier": ("classification", "chat"),
                "semantic_similarity": ("embeddings",), "llm": ("chat",)}


def member_modes(policy: Policy) -> list[tuple[str, str, tuple[str, ...]]]:
    """(field, model name, modes it may have) for every model the policy calls."""
    out = [(f"routing.candidates[{i}]", c, MEMBER_MODES["candidate"]) for i, c in enumerate(policy.candidates)]
    for i, clf in enumerate(policy.classifiers.values()):
        where = "routing.router.model" if clf.id == ROUTER_CLASSIFIER else f"routing.classifiers[{i}].model"
        out.append((where, clf.model, MEMBER_MODES[clf.type]))
    return out


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """Case folding of keyword matching: ASCII letters only (`É` stays `É`), as the schema fixes it."""
    return text.translate(_ASCII_LOWER)

