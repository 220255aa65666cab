"""Issue 16: the `vllm` recipe is a wired engine (`vllm serve` per loaded model) that refuses clearly on
a machine without a CUDA/ROCm GPU, such as the machines these tests run on.

When this machine has such a GPU the refusal tests are skipped (they would not hold); serving with
vLLM itself needs a GPU and several GB of packages, which no test here downloads.
"""

from __future__ import annotations

import pytest

from lemonade.backends.llamacpp.gpu import backend_devices
from lemonade.system.devices import detect_devices

GPU = any(backend_devices(b, detect_devices()) for b in ("cuda", "rocm"))
pytestmark = pytest.mark.skipif(GPU, reason="this machine has a CUDA/ROCm GPU: vLLM would not be refused here")


def test_engine_describes_and_builds_its_command(tmp_path):
    from lemonade.backends.engine import EngineUnavailable
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(tmp_path, Config(tmp_path, environ={})).get("vllm")
    assert engine is not None and engine.available and engine.process == "vllm"
    for backend in ("cuda", "rocm"):
        st = engine.state(backend)
        assert st.state == "unsupported" and "scale-out.md" in st.message and "llamacpp" in st.message
    with pytest.raises(EngineUnavailable) as err:
        engine.ready_backend(engine.requested_backend({"vllm_backend": "auto"}))
    assert err.value.code == "unsupported_backend" and "GPU" in str(err.value)
    assert engine.check_args("--tensor-parallel-size 2 --distributed-executor-backend ray") == [
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    with pytest.raises(ValueError, match="--trust-remote-code"):
        engine.check_args("--trust-remote-code")  # runs code from the model repository: admin only
    with pytest.raises(ValueError, match="--port"):
        engine.check_args("--port 1", trusted=True)


def test_load_and_install_refused_with_reason(make_server):
    srv = make_server()
    with srv.client() as c:
        info = c.get("/v1/system-info").json()["recipes"]["vllm"]
        assert {b["state"] for b in info["backends"].values()} == {"unsupported"}
        r = c.post("/v1/models/register", json={"model_name": "user.Qwen3-0.6B-vllm", "recipe": "vllm",
                                                 "checkpoint": "Qwen/Qwen3-0.6B"})
        assert r.status_code == 200, r.text
        r = c.post("/v1/load", json={"model_name": "user.Qwen3-0.6B-vllm"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "unsupported_backend"
        assert "vLLM serves on CUDA or ROCm GPUs only" in error["message"] and "llamacpp" in error["message"]
        r = c.post("/v1/load", json={"model_name": "user.Qwen3-0.6B-vllm", "vllm_args": "--trust-remote-code"})
        assert r.status_code == 400 and "--trust-remote-code" in r.json()["error"]["message"], r.text
        r = c.post("/v1/install", json={"recipe": "vllm", "backend": "cuda"})
        assert r.status_code == 400 and "GPU" in r.json()["error"]["message"], r.text


def test_catalog_vllm_entries_bring_their_parser_and_mtp(tmp_path):
    """Upstream's per-model vLLM arguments (its vllm_model_config.json) are the entries' recipe_options,
    under what a user saves; the `mtp` label adds the MTP speculative config unless the user sets one."""
    from pathlib import Path

    from lemonade.backends.vllm.engine import MTP_ARGS, build_argv
    from lemonade.config import Config
    from lemonade.observability.logs import LogBuffer
    from lemonade.services import Services

    svc = Services(tmp_path, Config(tmp_path, environ={}), LogBuffer())
    model = svc.catalog.resolve("Qwen3.6-27B-FP8-vLLM-lowconc")
    options = svc.options.resolve(model.name, model.recipe)
    assert options["vllm_args"] == "--enable-auto-tool-choice --tool-call-parser qwen3_coder --max-num-seqs 8"
    engine = svc.engines.get("vllm")
    user_args = engine.check_args(options["vllm_args"])
    argv = build_argv(Path("/bin/vllm"), model, Path("/m"), options, 4242, user_args)
    at = argv.index("--speculative-config")
    assert argv[at:at + 2] == MTP_ARGS and argv[at + 2:] == user_args  # the user's flags last
    svc.options.merge_saved(model.name, {"vllm_args": "--max-num-seqs 4"})
    mine = svc.options.resolve(model.name, model.recipe)["vllm_args"]
    assert mine == "--max-num-seqs 4"  # the user's saved value replaces the catalog's
    plain = svc.catalog.resolve("Qwen3.5-0.8B-FP16-vLLM")
    assert "--speculative-config" not in build_argv(Path("/bin/vllm"), plain, Path("/m"), {}, 4242, [])
