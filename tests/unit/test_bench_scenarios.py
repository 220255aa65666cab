"""`lemonade bench`'s scenario files and `--compare` rules (guide-cli.md, "Options for bench"), on
files and saved results written here. The measuring itself runs on the real server and Gemma in
tests/test_bench.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from lemonade.autotune.bench import percentile, settings
from lemonade.autotune.bench_compare import deltas, model_summary
from lemonade.autotune.scenarios import OPT_IN, ScenarioError, bundled, expand_context, load_dir, load_file, select

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5"
                       "ErkJggg==")  # a 1x1 picture


def write(path: Path, scenarios: list[dict]) -> Path:
    path.write_text(json.dumps({"scenarios": scenarios}))
    return path


def test_bundled_scenarios_and_the_default_selection() -> None:
    every = bundled()
    names = {s.name for s in every}
    # Lemonade's bundled names, so a comparison with its results files matches scenario by scenario
    assert {"chat-short", "chat-long-output", "code-short", "code-explain", "code-debug", "context-32k",
            "context-64k", "context-128k", "context-multi-turn", "embed-small-string"} <= names
    default = select(every, None)
    assert default and all(s.category not in OPT_IN for s in default)
    assert {s.category for s in select(every, ["all"])} >= {"chat", "coding", "long-context", "embed", "imagegen"}
    assert [s.name for s in select(every, ["chat-short", "coding"])] == ["chat-short", "code-short", "code-explain",
                                                                        "code-debug"]
    long = next(s for s in every if s.name == "context-32k")
    assert 32000 * 4 <= len(long.messages[0]["content"]) < 32000 * 4 + 1000  # grown to ~32k tokens
    with pytest.raises(ScenarioError, match="no scenario has that name or category.*chat-short"):
        select(every, ["nope"])


def test_context_expansion_places_the_question() -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q?"}]
    context = {"filler": "abcd", "target_tokens": 10}
    assert expand_context(context, messages) == "abcd" * 10 + "\n\nQ?"
    assert expand_context({**context, "position": "start"}, messages) == "Q?\n\n" + "abcd" * 10
    assert expand_context({**context, "position": "middle"}, messages) == "abcd" * 5 + "\n\nQ?\n\n" + "abcd" * 5


def test_a_scenario_file_is_read_with_its_defaults_and_checked(tmp_path: Path) -> None:
    (tmp_path / "pic.png").write_bytes(PNG)
    good = write(tmp_path / "s.json", [
        {"name": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"name": "v", "category": "vision", "image_path": "pic.png",
         "messages": [{"role": "user", "content": "what is it?"}]},
        {"name": "e", "category": "embed", "input": ["x", "y"], "measurement_runs": 1},
        {"name": "i", "category": "imagegen", "prompt": "a lemon", "size": "64x64"}])
    a, v, e, i = load_file(good)
    assert (a.category, a.max_tokens, a.warmup_runs, a.measurement_runs, a.kind) == ("general", 128, 0, 3, "textgen")
    assert (v.kind, v.max_tokens) == ("vision", 1024)
    content = v.chat_messages()[0]["content"]
    assert content[0] == {"type": "text", "text": "what is it?"}
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert (e.kind, e.input, e.measurement_runs) == ("embed", ["x", "y"], 1)
    assert i.image == {"prompt": "a lemon", "size": "64x64", "seed": 42}
    bad = [([{"name": "v", "category": "vision", "messages": [{"role": "user", "content": "?"}]}],
            "non-empty 'image_path'"),
           ([{"name": "v", "category": "vision", "image_path": "../pic.png", "messages": [{"role": "user"}]}],
            "in the scenario file's folder"),
           ([{"name": "v", "category": "vision", "image_path": "gone.png", "messages": [{"role": "user"}]}],
            "image file not found"),
           ([{"name": "x", "messages": []}], "'messages' must be a list"),
           ([{"name": "x", "category": "embed"}], "needs 'input'"),
           ([{"name": "x", "category": "imagegen"}], "needs a 'prompt'"),
           ([{"name": "x", "messages": [{"role": "user"}], "max_tokens": 0}], "'max_tokens' must be a positive"),
           ([{"name": "x", "messages": [{"role": "user"}]}] * 2, "duplicate scenario name"),
           ([{"category": "chat"}], "needs a 'name'")]
    for scenarios, says in bad:
        with pytest.raises(ScenarioError, match=says):
            load_file(write(tmp_path / "bad.json", scenarios))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_file(tmp_path / "broken.json")


def test_a_scenario_folder_keeps_the_first_of_a_name(tmp_path: Path) -> None:
    write(tmp_path / "1.json", [{"name": "a", "messages": [{"role": "user", "content": "one"}]}])
    write(tmp_path / "2.json", [{"name": "a", "messages": [{"role": "user", "content": "two"}]},
                                {"name": "b", "messages": [{"role": "user", "content": "three"}]}])
    scenarios, warnings = load_dir(tmp_path)
    assert [(s.name, s.messages[0]["content"]) for s in scenarios] == [("a", "one"), ("b", "three")]
    assert warnings == ["duplicate scenario name 'a' in 2.json: skipped"]


def test_settings_put_stock_first_and_percentiles_interpolate() -> None:
    grid = settings(["cpu"], [2048, 4096], ["-b 256"], {"parallel": [None, 2]})
    assert [(s.ctx_size, s.args, s.params) for s in grid] == [
        (2048, "-b 256", {"parallel": None}), (2048, "-b 256", {"parallel": 2}),
        (4096, "-b 256", {"parallel": None}), (4096, "-b 256", {"parallel": 2})]
    assert grid[0].options("llamacpp") == {"ctx_size": 2048, "llamacpp_args": "-b 256", "merge_args": False}
    assert grid[1].options("llamacpp")["llamacpp_args"] == "-b 256 -np 2"
    assert settings(["cpu"], [], [], {})[0].stock
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)


def scenario(name: str, ttft: float, tps: float, mem: float | None = None, failed: bool = False) -> dict:
    if failed:
        return {"name": name, "all_runs_failed": True, "failed_runs": 3}
    out = {"name": name, "ttft_ms": {"mean": ttft}, "tps": {"mean": tps}}
    if mem is not None:
        out["model_memory_gb"] = {"peak": mem}
    return out


def test_comparison_statuses_and_changes() -> None:
    now = {"results": [{"recipe": "llamacpp", "backend": "cpu", "ctx_size": 4096, "backend_args": "",
                        "scenarios": [scenario("same", 90, 22, 0.5), scenario("fresh", 1, 1),
                                      scenario("broke", 0, 0, failed=True), scenario("was-broken", 5, 5)]}]}
    before = {"results": [{"recipe": "llamacpp", "backend": "cpu", "ctx_size": 4096, "backend_args": "",
                           "scenarios": [scenario("same", 100, 20, 0.4), scenario("broke", 1, 1),
                                         scenario("was-broken", 0, 0, failed=True), scenario("gone", 1, 1)]},
                          {"recipe": "llamacpp", "backend": "cpu", "ctx_size": 8192, "backend_args": "",
                           "scenarios": [scenario("same", 1, 1)]}]}
    by_name = {(d["ctx_size"], d["scenario"]): d for d in deltas(now, before)}
    same = by_name[(4096, "same")]
    assert (same["status"], same["ttft_pct_change"], same["tps_pct_change"]) == ("matched", -10.0, 10.0)
    assert same["model_memory_gb_change"] == 0.1 and same["vram_gb_change"] is None
    assert {k: d["status"] for k, d in by_name.items() if k != (4096, "same")} == {
        (4096, "fresh"): "new", (4096, "broke"): "failed", (4096, "was-broken"): "prev_failed",
        (4096, "gone"): "removed", (8192, "same"): "removed"}
    assert model_summary(["a", "b"], {"b": {}, "c": {}}) == {
        "current_models": ["a", "b"], "previous_models": ["b", "c"], "matched_models": ["b"],
        "new_models": ["a"], "removed_models": ["c"]}
