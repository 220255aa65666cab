"""`lemonade bench` as Lemonade's guide has it (guide-cli.md, "Options for bench"), end to end on a
real server with the real Gemma 3 270M: a scenario file, two context sizes and an argument set, the
table and the JSON, the model's memory beside the speed, `--response-log`, `--no-reload`,
`--compare` against the saved run, and the preflight with and without `--auto-pull` (the model
downloaded from the local hub by the real huggingface_hub). The scenario rules and the comparison's
statuses are in tests/unit/test_bench_scenarios.py; auto-tune's grid and `--submit` in
tests/test_autotune.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import GEMMA_NAME
from tests.hub.fixtures import GEMMA_FILE, GEMMA_REPO

SCENARIOS = [
    {"name": "hello", "category": "chat", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4},
    {"name": "add", "category": "coding", "messages": [{"role": "user", "content": "def add(a, b):"}],
     "max_tokens": 4},
]


def bench(server, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_BASE_URL": server.url, "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", "bench", *args], env=env,
                          capture_output=True, text=True, timeout=900, cwd=cwd)


def loads(server) -> int:
    with server.client() as c:
        return c.get("/v1/health").json()["queue"]["loads_total"]


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps({"scenarios": SCENARIOS}))
    return path


def test_bench_scenarios_settings_memory_log_and_compare(gemma_server, scenario_file: Path, tmp_path: Path) -> None:
    before = loads(gemma_server)
    base, log = tmp_path / "base.json", tmp_path / "answers.jsonl"
    # Lemonade's way of giving several values: `--ctx-size 2048 4096` after one flag
    done = bench(gemma_server, GEMMA_NAME, GEMMA_NAME, "--scenario-file", str(scenario_file), "--runs", "2",
                 "--ctx-size", "2048", "4096", "--llamacpp-args", "-b 256", "--output", str(base),
                 "--response-log", str(log), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 duplicate model name(s) left out" in done.stderr
    assert f"Benchmark: {GEMMA_NAME}" in done.stdout
    assert "Backend: llamacpp/cpu (ctx=2048) args=[-b 256]" in done.stdout
    assert "Model mem (GB)" in done.stdout and "context 4096" in done.stdout
    report = json.loads(base.read_text())
    (model,) = report["models"]
    assert model["model"] == GEMMA_NAME and model["config"]["measurement_runs"] == 2
    assert [(r["ctx_size"], r["backend_args"]) for r in model["results"]] == [(2048, "-b 256"), (4096, "-b 256")]
    for result in model["results"]:
        cmd = result["launch_command"]
        assert cmd[cmd.index("--ctx-size") + 1] == str(result["ctx_size"]) == str(result["context_length"])
        assert cmd[cmd.index("-b") + 1] == "256"  # the argument set reached the engine
        assert result["memory_estimate_gb"] > 0.1  # the server's estimate for the load
        assert [s["name"] for s in result["scenarios"]] == ["hello", "add"]
        for s in result["scenarios"]:
            assert s["failed_runs"] == 0 and s["ttft_ms"]["mean"] > 0 and s["tps"]["mean"] > 0
            assert s["duration_ms"]["min"] <= s["duration_ms"]["p50"] <= s["duration_ms"]["max"]
            assert s["input_tokens"] > 3 and 0 < s["output_tokens"] <= 4
            # the engine's own memory, as the server measured it, beside the machine's
            assert 0.05 < s["model_memory_gb"]["peak"] < 2 and s["memory_peak_gb"] > s["model_memory_gb"]["peak"]
    # a fresh engine before every run: per setting one load to start, then one per run (2 scenarios x 2)
    assert loads(gemma_server) - before == 2 * (1 + 2 * 2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2 * 2 * 2
    assert {(x["ctx_size"], x["scenario"], x["run_number"]) for x in lines} == {
        (c, s, n) for c in (2048, 4096) for s in ("hello", "add") for n in (1, 2)}
    assert all(x["backend"] == "cpu" and x["backend_args"] == "-b 256" and isinstance(x["response"], str)
               and x["output_tokens"] > 0 for x in lines)

    before = loads(gemma_server)
    again = bench(gemma_server, GEMMA_NAME, "--scenario-file", str(scenario_file), "--runs", "1", "--ctx-size",
                  "2048", "--llamacpp-args", "-b 256", "--no-reload", "--compare", str(base), "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert loads(gemma_server) - before == 1  # --no-reload: one load serves the setting's runs
    compared = json.loads(again.stdout)
    assert compared["previous_timestamp"] == report["timestamp"] and compared["compare_file"] == str(base)
    assert compared["model_summary"]["matched_models"] == [GEMMA_NAME]
    status = {(d["ctx_size"], d["scenario"]): d["status"] for d in compared["models"][0]["comparison"]}
    assert status == {(2048, "hello"): "matched", (2048, "add"): "matched", (4096, "hello"): "removed",
                      (4096, "add"): "removed"}
    matched = next(d for d in compared["models"][0]["comparison"] if d["status"] == "matched")
    assert isinstance(matched["tps_pct_change"], float) and matched["model_memory_gb_change"] is not None
    table = bench(gemma_server, GEMMA_NAME, "--scenario-file", str(scenario_file), "--runs", "1", "--ctx-size",
                  "2048", "--llamacpp-args", "-b 256", "--no-reload", "--compare", str(base), cwd=tmp_path)
    assert table.returncode == 0 and "Comparison: " + GEMMA_NAME in table.stdout and "(removed)" in table.stdout


def test_bench_refuses_what_it_cannot_run(gemma_server, scenario_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"scenarios": [{"name": "x", "category": "vision", "messages": [{"role": "user"}]}]}))
    done = bench(gemma_server, GEMMA_NAME, "--scenario-file", str(bad), cwd=tmp_path)
    assert done.returncode == 2 and "scenario 'x': a vision scenario needs a non-empty 'image_path'" in done.stderr
    done = bench(gemma_server, GEMMA_NAME, "--scenarios", "nothing-like-it", cwd=tmp_path)
    assert done.returncode == 2 and "no scenario has that name or category" in done.stderr
    done = bench(gemma_server, GEMMA_NAME, "--compare", str(scenario_file), cwd=tmp_path)
    assert done.returncode == 2 and "is not a bench results file" in done.stderr
    done = bench(gemma_server, "no-such-model", cwd=tmp_path)
    assert done.returncode == 1 and "Model 'no-such-model' not found. Use --auto-pull" in done.stderr


@pytest.fixture(scope="module")
def hub_server_bench(module_servers, hub_server):
    """A server that downloads from the local hub (the preflight's pull)."""
    return module_servers(env=hub_server.env())


def register(server, name: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        resp = c.post("/v1/models/register", json={"model_name": name, "checkpoint": f"{GEMMA_REPO}:Q4_K_M",
                                                   "recipe": "llamacpp", "labels": ["chat"]})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_preflight_and_auto_pull(hub_server_bench, hub_server, tmp_path: Path) -> None:
    server = hub_server_bench
    before = len(hub_server.downloads(file=GEMMA_FILE))  # the hub serves this worker's other test files too
    assert register(server, "user.Bench-Pull")["model"]["downloaded"] is False
    refused = bench(server, "user.Bench-Pull", "--scenarios", "chat-short", "--runs", "1", cwd=tmp_path)
    assert refused.returncode == 1
    assert ("Model 'user.Bench-Pull' is not downloaded. Run `lemonade pull user.Bench-Pull` first, or use "
            "--auto-pull") in refused.stderr
    assert loads(server) == 0 and len(hub_server.downloads(file=GEMMA_FILE)) == before  # nothing ran, nothing came
    pulled = bench(server, "user.Bench-Pull", "--scenarios", "chat-short", "--runs", "1", "--no-reload",
                   "--auto-pull", "--json", cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "Preflight: model 'user.Bench-Pull' is not downloaded; pulling it." in pulled.stderr
    assert len(hub_server.downloads(file=GEMMA_FILE)) == before + 1
    (result,) = json.loads(pulled.stdout)["models"][0]["results"]
    (scenario,) = result["scenarios"]
    assert scenario["name"] == "chat-short" and scenario["tps"]["mean"] > 0  # the bundled scenario ran


@pytest.fixture(scope="module")
def vision_and_embedding_server(module_servers, gemma_dir, tmp_path_factory):
    """An extra models dir with Gemma and a random-weight vision projector in one folder (a `vision`
    model, tests/vision_projector.py) and all-MiniLM-L6-v2 (an embedding model)."""
    from tests.models import minilm_gguf
    from tests.vision_projector import write_vision_projector

    extra = tmp_path_factory.mktemp("bench-extra")
    (extra / "vis").mkdir()
    os.link(gemma_dir / f"{GEMMA_NAME}.gguf", extra / "vis" / f"{GEMMA_NAME}.gguf")
    write_vision_projector(extra / "vis" / "mmproj-gemma.gguf")
    os.link(minilm_gguf(), extra / "minilm.gguf")
    return module_servers(env={"LEMONADE_EXTRA_MODELS_DIR": str(extra)})


def test_vision_and_embed_scenarios_go_to_the_models_that_suit_them(vision_and_embedding_server,
                                                                     tmp_path: Path) -> None:
    from PIL import Image

    server = vision_and_embedding_server
    Image.new("RGB", (56, 56), (200, 40, 40)).save(tmp_path / "red.png")
    (tmp_path / "mixed.json").write_text(json.dumps({"scenarios": [
        {"name": "see", "category": "vision", "image_path": "red.png",
         "messages": [{"role": "user", "content": "Which colour is this?"}], "max_tokens": 4},
        {"name": "vectors", "category": "embed", "input": ["one lemon", "two lemons"]}]}))
    done = bench(server, "vis", "minilm", "--scenario-file", str(tmp_path / "mixed.json"), "--scenarios", "all",
                 "--runs", "1", "--no-reload", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Skipping scenario vectors (embed): not suitable for vis" in done.stderr
    assert "Skipping scenario see (vision): not suitable for minilm" in done.stderr
    vis, minilm = json.loads(done.stdout)["models"]
    (see,) = vis["results"][0]["scenarios"]
    # the picture reached the engine: its 16 embeddings are counted in the prompt (vision_projector.py)
    assert see["name"] == "see" and see["input_tokens"] >= 16 and see["tps"]["mean"] > 0
    (vectors,) = minilm["results"][0]["scenarios"]
    assert vectors["name"] == "vectors" and vectors["ttft_ms"]["mean"] == vectors["duration_ms"]["mean"] > 0
    assert vectors["input_tokens"] > 0 and vectors["model_memory_gb"]["peak"] > 0.01
    text_only = bench(server, "minilm", "--runs", "1", cwd=tmp_path)
    assert text_only.returncode == 2 and "none of the chosen scenarios suits minilm" in text_only.stderr
