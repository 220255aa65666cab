"""The omni loop sends each round's tool calls back to llama-server, which parses every argument
string of a replayed call as JSON and answers 500 for one it cannot (common/chat.cpp,
"Failed to parse tool call arguments as JSON"): a forced call cut by `max_tokens` comes back with
arguments that are not JSON, or with none at all."""

from __future__ import annotations

import json

import pytest

from lemonade.omni.loop import _replayable


def call(arguments: object) -> dict[str, object]:
    return {"id": "c1", "type": "function", "function": {"name": "transcribe_audio", "arguments": arguments}}


@pytest.mark.parametrize("cut", ["", "   \n", '{"audio', "[1, 2]", "null"])
def test_a_call_whose_arguments_are_not_a_json_object_is_sent_back_with_empty_ones(cut):
    replayed = _replayable(call(cut))
    assert replayed["function"] == {"name": "transcribe_audio", "arguments": "{}"}
    assert json.loads(replayed["function"]["arguments"]) == {}


@pytest.mark.parametrize("whole", ['{"audio": "#1"}', {"audio": "#1"}])
def test_a_whole_call_is_sent_back_as_it_came(whole):
    assert _replayable(call(whole)) == call(whole)
