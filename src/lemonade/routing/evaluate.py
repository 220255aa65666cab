"""Deciding where a request goes: rules top to bottom, first match wins, else `default_model`.

Model-backed conditions reach models only through `ClassifierServices`, three callables the
caller binds (the server to its engines, tests to fixed answers); each may return a value or an
awaitable. A classifier runs at most once per request, and only when a rule needs it (`any` and
`all` stop at the first child that decides them). Nothing raises out of `decide` (but what the
caller lists in `propagate`): a classifier that fails applies its `on_error`, and anything
unexpected fails open to `default_model`. Once the candidate is chosen, `cost_of` (when bound)
says what it is said to cost, added to the decision's `outputs` as `estimated_cost` (cost.py).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from lemonade.routing.context import RouteContext
from lemonade.routing.cost import with_cost
from lemonade.routing.policy import (
    SCHEMA_VERSION,
    AllOf,
    AnyOf,
    Band,
    Chars,
    ClassifierDef,
    Feature,
    Keywords,
    Metadata,
    Node,
    Not,
    Policy,
    Regex,
    ascii_lower,
)

log = logging.getLogger("lemonade.routing")
T = TypeVar("T")
MaybeAwaitable: TypeAlias = T | Awaitable[T]
# (model, text) -> {label: score}: an encoder classifier, or a chat model asked for label scores.
Classify = Callable[[str, str], MaybeAwaitable[Mapping[str, float]]]
# (model, text) -> embedding vector.
Embed = Callable[[str, str], MaybeAwaitable[Sequence[float]]]
# (model, system prompt, user message, JSON schema of the reply) -> the assistant's reply text. The
# schema is the reply contract; the server asks the model under it as a grammar (llm_reply_schema).
Chat = Callable[[str, str, str, Mapping[str, Any]], MaybeAwaitable[str]]
# candidate -> its cost fields (routing/cost.py `estimated_cost`), {} when none are known.
CostOf = Callable[[str], Mapping[str, Any]]
RATIONALE_MAX_CHARS = 160  # the grammar closes the object by then (a helper's reply is capped in tokens)
REGEX_MAX_INPUT = 1 << 20   # bytes; a longer input never matches a regex (bounded time on any text)
WHITESPACE = " \t\r\n"


@dataclass
class ClassifierServices:
    classify: Classify | None = None
    embed: Embed | None = None
    chat: Chat | None = None
    cost_of: CostOf | None = None
    # Failures that end the request instead of counting as a classifier's failure (a client that left).
    propagate: tuple[type[BaseException], ...] = ()


@dataclass
class TraceEntry:
    condition: str
    result: bool
    score: float | None = None
    label: str | None = None
    rationale: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"condition": self.condition, "result": self.result}
        if self.score is not None:
            out["score"] = self.score
        if self.label:
            out["label"] = self.label
        if self.rationale:
            out["rationale"] = self.rationale
        return out


@dataclass
class Decision:
    route_to: str
    matched_rule: str = ""
    default_used: bool = True
    outputs: Mapping[str, Any] = field(default_factory=dict)
    trace: list[TraceEntry] | None = None        # None: not asked for

    @property
    def header(self) -> str:
        """The `x-lemonade-route` value: the rule that matched, or `default`."""
        return self.matched_rule or "default"

    def to_json(self) -> dict[str, Any]:
        """The `x_lemonade_route` object."""
        out: dict[str, Any] = {"version": SCHEMA_VERSION, "route_to": self.route_to,
                               "matched_rule": self.matched_rule, "default_used": self.default_used,
                               "outputs": dict(self.outputs)}
        if self.trace is not None:
            out["trace"] = [t.to_json() for t in self.trace]
        return out


@dataclass
class Score:
    labels: dict[str, float]
    ok: bool = True
    rationale: str = ""


class PolicyEmbeddings:
    """Reference-phrase embeddings of semantic_similarity classifiers, computed once per model and
    phrase and kept for the next requests (the phrases are fixed by the policy)."""

    def __init__(self) -> None:
        self.vectors: dict[tuple[str, str], list[float]] = {}


async def _resolve(value: MaybeAwaitable[T]) -> T:
    return await value if inspect.isawaitable(value) else value


def _cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) != len(b) or not a:
        return None
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return None
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def llm_contract(clf: ClassifierDef) -> str:
    """The author's prompt plus the reply format every `llm` classifier is held to."""
    return (f"{clf.prompt}\n\nThe user message is a JSON object describing a request: {{\"text\": its latest user "
            "turn, \"has_tools\", \"has_images\", \"chars\": the text's length in bytes, \"metadata\": the "
            f"caller's hints}}. Choose exactly one of these labels: {', '.join(clf.labels)}. Reply with only a "
            "JSON object {\"rationale\": \"<one short sentence>\", \"model\": \"<one of the labels>\"} and no "
            "other text.")


def llm_reply_schema(labels: Sequence[str]) -> dict[str, Any]:
    """The contract's reply as a JSON schema, which the model is asked under as a grammar: a small
    model then cannot answer out of contract (no prose around the object, no label outside
    `labels`, a rationale that ends before the reply's token cap). The rationale comes first, so
    the model states its reason before it commits to a label: Gemma 3 270M, asked for the label
    first, took whichever label the prompt listed first; reason first, it answered by the text."""
    return {"type": "object", "additionalProperties": False, "required": ["rationale", "model"],
            "properties": {"rationale": {"type": "string", "minLength": 1, "maxLength": RATIONALE_MAX_CHARS},
                           "model": {"enum": list(labels)}}}


def parse_llm_reply(reply: str, labels: Sequence[str]) -> Score:
    """A reply that is exactly the contract's object (one ``` fence allowed) names a label in its
    `model` key (Lemonade's contract, whose key is `model` for a router's candidates and a
    condition's labels alike); anything else scores no label, so no band on it matches."""
    text = reply.strip()
    if text.startswith("```"):
        first, last = text.find("\n"), text.rfind("```")
        if first < 0 or last <= first or text[last + 3:].strip():
            return Score({})
        text = text[first + 1:last].strip()
    try:
        data = json.loads(text)
    except ValueError:
        return Score({})
    if (not isinstance(data, dict) or set(data) != {"model", "rationale"} or data["model"] not in labels
            or not isinstance(data["rationale"], str) or not data["rationale"].strip()):
        return Score({})
    return Score({data["model"]: 1.0}, rationale=data["rationale"].strip())


class _Evaluation:
    """One request's evaluation: the classifier memo and the trace."""

    def __init__(self, policy: Policy, ctx: RouteContext, services: ClassifierServices, want_trace: bool,
                 embeddings: PolicyEmbeddings) -> None:
        self.policy, self.ctx, self.services, self.embeddings = policy, ctx, services, embeddings
        self.trace: list[TraceEntry] = []
        self.want_trace = want_trace
        self.memo: dict[str, Score] = {}
        self._lowered: str | None = None

    def record(self, condition: str, result: bool, **extra: Any) -> bool:
        if self.want_trace:
            self.trace.append(TraceEntry(condition, result, **extra))
        return result

    @property
    def lowered(self) -> str:
        if self._lowered is None:
            self._lowered = ascii_lower(self.ctx.text)
        return self._lowered

    async def match(self, node: Node) -> bool:
        if isinstance(node, AllOf):
            for child in node.children:
                if not await self.match(child):
                    return False
            return True
        if isinstance(node, AnyOf):
            for child in node.children:
                if await self.match(child):
                    return True
            return False
        if isinstance(node, Not):
            return not await self.match(node.child)
        if isinstance(node, Band):
            return await self.band(node)
        return self.record(node.op, self.deterministic(node))

    def deterministic(self, node: Node) -> bool:
        ctx = self.ctx
        if isinstance(node, Keywords):
            found = (w in self.lowered for w in node.words)
            return all(found) if node.require_all else any(found)
        if isinstance(node, Regex):
            return ctx.chars <= REGEX_MAX_INPUT and node.pattern.search(ctx.text) is not None
        if isinstance(node, Chars):
            return ctx.chars >= node.limit if node.op == "min_chars" else ctx.chars <= node.limit
        if isinstance(node, Feature):
            return (ctx.has_tools if node.op == "has_tools" else ctx.has_images) == node.expected
        if isinstance(node, Metadata):
            value = ctx.metadata.get(node.key)
            present = value is not None and value.strip(WHITESPACE) != ""
            if node.comparator == "exists":
                return present == node.exists
            if not present:
                return False
            if node.comparator == "equals":
                return value == node.equals
            tokens = {t.strip(WHITESPACE) for t in value.split(",")} - {""}  # type: ignore[union-attr]
            return bool(tokens & node.any_of)
        raise TypeError(f"unknown condition {node!r}")

    async def band(self, node: Band) -> bool:
        clf = self.policy.classifiers[node.classifier]
        score = await self.score(clf)
        value: float | None = None
        if not score.ok:
            result = clf.match_on_error
        else:
            label = node.label or clf.default_label
            if label is not None:
                value = float(score.labels.get(label, 0.0))
            else:  # a label-less classifier: its one score
                value = float(next(iter(score.labels.values()))) if len(score.labels) == 1 else 0.0
            result = ((node.min_score is None or value >= node.min_score)
                      and (node.max_score is None or value <= node.max_score))
        rationale = score.rationale if score.ok and (node.label is None or node.label in score.labels) else None
        return self.record(f"classifier:{clf.id}", result, score=value, label=node.label, rationale=rationale)

    async def score(self, clf: ClassifierDef) -> Score:
        if clf.id not in self.memo:
            try:
                self.memo[clf.id] = await self._run(clf)
            except self.services.propagate:
                raise
            except Exception as exc:  # a model that failed: the band's on_error decides
                log.warning("Routing classifier '%s' (%s) failed: %s", clf.id, clf.model, exc)
                self.memo[clf.id] = Score({}, ok=False)
        return self.memo[clf.id]

    async def _run(self, clf: ClassifierDef) -> Score:
        services, text = self.services, self.ctx.text
        if clf.type == "classifier":
            if services.classify is None:
                raise RuntimeError("no classifier service")
            raw = await _resolve(services.classify(clf.model, text))
            labels = {str(k): float(v) for k, v in raw.items()}
            if any(not 0.0 <= v <= 1.0 for v in labels.values()):
                raise ValueError(f"scores outside [0, 1]: {labels}")
            return Score(labels)
        if clf.type == "semantic_similarity":
            if services.embed is None:
                raise RuntimeError("no embedding service")
            query = await _resolve(services.embed(clf.model, text))
            scores: dict[str, float] = {}
            for concept, phrases in clf.reference_phrases.items():
                best: float | None = None
                for phrase in phrases:
                    key = (clf.model, phrase)
                    if key not in self.embeddings.vectors:
                        self.embeddings.vectors[key] = list(await _resolve(services.embed(clf.model, phrase)))
                    sim = _cosine(query, self.embeddings.vectors[key])
                    if sim is not None and (best is None or sim > best):
                        best = sim
                scores[concept] = best if best is not None else 0.0
            return Score(scores)
        if services.chat is None:
            raise RuntimeError("no chat service")
        reply = await _resolve(services.chat(clf.model, llm_contract(clf), json.dumps(self.ctx.describe()),
                                             llm_reply_schema(clf.labels)))
        return parse_llm_reply(reply, clf.labels)


async def decide(policy: Policy, ctx: RouteContext, *, want_trace: bool = False,
                 services: ClassifierServices | None = None, embeddings: PolicyEmbeddings | None = None) -> Decision:
    """The decision for one request. Raises nothing but `services.propagate`."""
    services = services or ClassifierServices()
    run = _Evaluation(policy, ctx, services, want_trace, embeddings or PolicyEmbeddings())
    trace = run.trace if want_trace else None
    decision = Decision(policy.default_model, "", True, {}, trace)
    try:
        for rule in policy.rules:
            if await run.match(rule.match):
                decision = Decision(rule.route_to, rule.id, False, dict(rule.outputs), trace)
                break
    except services.propagate:
        raise
    except Exception:
        log.exception("Routing policy evaluation failed; falling back to %s", policy.default_model)
    return _costed(decision, services.cost_of)


def _costed(decision: Decision, cost_of: CostOf | None) -> Decision:
    """The decision with its candidate's `estimated_cost`; a failing lookup only loses the figure."""
    if cost_of is None:
        return decision
    try:
        cost = cost_of(decision.route_to)
    except Exception:
        log.exception("Cannot read the cost of %s; the decision is reported without it", decision.route_to)
        return decision
    decision.outputs = with_cost(decision.outputs, cost)
    return decision
