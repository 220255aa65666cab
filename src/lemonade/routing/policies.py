"""The parsed policies of registered router models, kept between requests.

A policy is parsed (and validated) when its model is registered; requests reuse that parse, and the
reference-phrase embeddings of its semantic_similarity classifiers, until the model is registered
again (a new definition object) or removed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from lemonade.routing.evaluate import PolicyEmbeddings
from lemonade.routing.policy import Policy, parse_policy


class Policies:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[str, tuple[Mapping[str, Any], Policy, PolicyEmbeddings]] = {}

    def get(self, name: str, definition: Mapping[str, Any]) -> tuple[Policy, PolicyEmbeddings]:
        """The policy of model `name` (its stored definition), parsed once per definition."""
        with self._lock:
            cached = self._parsed.get(name)
            if cached is not None and cached[0] is definition:
                return cached[1], cached[2]
        policy, embeddings = parse_policy(definition), PolicyEmbeddings()
        with self._lock:
            self._parsed[name] = (definition, policy, embeddings)
        return policy, embeddings
