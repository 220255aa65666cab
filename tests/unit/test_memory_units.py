"""The memory budget and the estimates (docs/memory.md), on figures and tiny GGUF headers: no engine.

The end-to-end proof is tests/test_memory.py (the real server in a memory-capped host) and the
estimate's distance from measured engines is benchmarks/bench_memory.py; these check the arithmetic
against llama.cpp's own layout rules (the cell counts its log prints) in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lemonade.backends.engine import MemoryNeed
from lemonade.backends.llamacpp.memory import engine_flags, memory_need, prompt_cache_mib
from lemonade.system import memory
from lemonade.system.memory import CgroupMemory, MemoryBudget
from tests.gguf_factory import write_gguf

MiB = 1 << 20
GEMMA3 = {"block_count": 18, "embedding_length": 640, "feed_forward_length": 2048, "attention.head_count": 4,
          "attention.head_count_kv": 1, "attention.key_length": 256, "attention.value_length": 256,
          "attention.sliding_window": 512}


def cgroup(limit: int | None, anon: int, usage: int = 0) -> CgroupMemory:
    return CgroupMemory(1, Path("/x"), limit, usage or anon, 0, anon, 0)


def test_the_budget_is_the_smallest_of_ram_the_cgroup_and_what_is_free():
    roomy = MemoryBudget(16 << 30, 12 << 30, None, 0)
    assert roomy.budget_bytes == 12 << 30 and roomy.source == "available" and roomy.cap_bytes == 16 << 30
    # what our own engines hold is ours to account for: it counts as free for us
    assert MemoryBudget(16 << 30, 12 << 30, None, 2 << 30).budget_bytes == 14 << 30
    # a 4 GiB container on a 64 GiB host: the cgroup's limit, less the rest of the cgroup's anonymous memory
    boxed = MemoryBudget(64 << 30, 60 << 30, cgroup(4 << 30, anon=1 << 30), 512 << 20, 256 << 20)
    assert boxed.source == "cgroup" and boxed.cap_bytes == 4 << 30
    assert boxed.budget_bytes == (4 << 30) - ((1 << 30) - (256 << 20))
    assert boxed.admissible_bytes == boxed.budget_bytes - max(memory.RESERVE_MIN_BYTES, int(0.05 * (4 << 30)))
    assert boxed.describe()["memory_budget_source"] == "cgroup"


def test_cgroup_files_of_both_versions_are_read(tmp_path, monkeypatch):
    v1 = tmp_path / "memory" / "box"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text("300000000\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.stat").write_text("hierarchical_memory_limit 734003200\ntotal_rss 200000000\n"
                                    "total_inactive_file 50000000\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    monkeypatch.setattr(memory, "_own_paths", lambda pid: ("/", "/box"))
    found = memory.cgroup_memory(root=tmp_path)
    assert found is not None and found.version == 1
    assert (found.limit_bytes, found.anon_bytes, found.oom_kills) == (734003200, 200000000, 2)
    assert found.working_set_bytes == 250000000

    v2 = tmp_path / "v2" / "outer" / "inner"
    v2.mkdir(parents=True)
    (tmp_path / "v2" / "outer" / "memory.max").write_text("1073741824\n")
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("600000000\n")
    (v2 / "memory.stat").write_text("anon 400000000\nshmem 1000\ninactive_file 100000000\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(memory, "_own_paths", lambda pid: ("/outer/inner", None))
    found = memory.cgroup_memory(root=tmp_path / "v2")
    assert found is not None and found.version == 2
    assert (found.limit_bytes, found.anon_bytes, found.oom_kills) == (1073741824, 400001000, 1)  # the parent's limit


def test_engine_flags_as_llama_server_reads_them():
    assert engine_flags("") == engine_flags("-np -1")  # automatic: 4 slots sharing one cache
    assert engine_flags("").slots == 4 and engine_flags("").unified
    profile = engine_flags("-np 8 -kvu")
    assert (profile.slots, profile.unified) == (8, True)
    own = engine_flags("--parallel=2 -ub 128 -ctk q8_0 --cache-ram 64 -ctxcp 3 -fa off --swa-full")
    assert (own.slots, own.unified, own.ubatch, own.k_bytes, own.v_bytes) == (2, False, 128, 34 / 32, 2.0)
    assert (own.cache_ram_mib, own.checkpoints, own.flash_attn, own.swa_full) == (64, 3, False, True)
    # n_batch: the user's, else one ubatch, as the server starts a chat model (engine.batch_args)
    assert (engine_flags("").batch, own.batch, engine_flags("-b 2048").batch) == (512, 128, 2048)


def _gemma(tmp_path: Path) -> dict[str, list[Path]]:
    return {"main": [write_gguf(tmp_path / "g.gguf", "gemma3", context_length=32768, meta=GEMMA3)]}


@pytest.mark.parametrize(("args", "ctx", "full_cells", "window_cells"), [
    # llama.cpp's log: "creating non-SWA KV cache, size = N cells" and "SWA KV cache, size = M cells"
    ("-np 1", 4096, 4096, 1024),
    ("-np 8 -kvu", 32768, 32768, 4608),
    ("-np 8 -kvu", 2048, 2048, 2048),  # the window cache is never bigger than the context
    ("-np 4", 8192, 8192, 4096),  # four streams of their own: 1024 window cells each
])
def test_the_kv_cache_has_the_cells_llama_cpp_allocates(tmp_path, args, ctx, full_cells, window_cells):
    need = memory_need(_gemma(tmp_path), {"ctx_size": ctx, "llamacpp_args": args}, "cpu", None)
    assert need is not None and need.ctx == ctx
    full_row = 3 * 1 * (256 + 256) * 2  # three full-attention layers (one in six), 1 KV head, f16
    window_row = 15 * 1 * (256 + 256) * 2
    kv = full_row * full_cells + window_row * window_cells
    # the prompt cache is bounded to as much again; what --cache-ram gets is exactly that
    assert prompt_cache_mib(_gemma(tmp_path)["main"][0], args, ctx, None) == kv // MiB
    assert {(round(rate), cap) for rate, cap in need.terms} >= {(full_row, None)}
    assert need.at(ctx) - need.fixed >= 2 * kv  # the cache and the prompt cache


@pytest.mark.parametrize(("args", "slot_cells"), [
    ("-np 1 --swa-full", 32768),  # a saved state holds only the last window of the window layers, even so
    ("-np 8 -kvu", 32768),  # one slot of a unified cache may hold the whole context
    ("-np 4", 8192),  # four caches of their own: a quarter each
])
def test_a_full_prompt_cache_holds_one_saved_prompt_more_for_a_moment(tmp_path, args, slot_cells):
    # llama-server b11312 copies a slot's state into the prompt cache, then evicts the oldest to get back
    # under --cache-ram; its log for Gemma 3 270M at 32,768 tokens: "saving prompt with length 26200, total
    # state size = 84.564 MiB" (the rule: 3 KB a token of the full-attention layers, 7.5 MiB of window)
    ctx = 32768
    full_row, window_row = 3 * (256 + 256) * 2, 15 * (256 + 256) * 2
    ours = memory_need(_gemma(tmp_path), {"ctx_size": ctx, "llamacpp_args": args}, "cpu", None)
    off = memory_need(_gemma(tmp_path), {"ctx_size": ctx, "llamacpp_args": f"{args} --cache-ram 0"}, "cpu", None)
    assert ours is not None and off is not None
    cap = prompt_cache_mib(_gemma(tmp_path)["main"][0], args, ctx, None) * MiB
    saved = full_row * slot_cells + window_row * 512
    assert abs(ours.at(ctx) - off.at(ctx) - cap - saved) <= MiB
    assert abs(full_row * 26200 + window_row * 512 - 84.564 * MiB) < 0.5 * MiB


def test_what_the_process_grows_by_per_prompt_token_is_counted(tmp_path):
    # measured on llama-server b11312 with Gemma 3 270M, one slot (smaps by mapping): heap and arenas
    # grew 8 MiB after a 6,539-token prompt at ctx 8,192, 19 MiB after a 26,200-token one at 32,768
    kv_and_masks = (3 + 15) * (256 + 256) * 2 + 2 * 2 * 512  # both kinds of layer hold every cell (--swa-full)
    full = memory_need(_gemma(tmp_path), {"ctx_size": 32768, "llamacpp_args": "-np 1 --cache-ram 0 --swa-full"},
                       "cpu", None)
    full_small = memory_need(_gemma(tmp_path), {"ctx_size": 8192,
                                                "llamacpp_args": "-np 1 --cache-ram 0 --swa-full"}, "cpu", None)
    assert full is not None and full_small is not None
    beyond_buffers = full.at(32768) - full_small.at(8192) - kv_and_masks * (32768 - 8192)
    assert beyond_buffers >= (19 - 8) * MiB


def test_auto_context_needs_are_a_range_and_the_rules_pick_what_fits(tmp_path):
    need = memory_need(_gemma(tmp_path), {"ctx_size": -1, "llamacpp_args": "-np 8 -kvu"}, "cpu", 64 << 30)
    assert need is not None and need.auto and (need.ctx_min, need.ctx) == (2048, 32768)
    fits = need.fit(need.at(8192) + 1)
    assert fits is not None and 8192 <= fits < 8192 + MemoryNeed.ALIGN
    assert need.fit(need.at(2048) - 1) is None
    assert need.fit(need.at(32768)) == 32768


def test_an_embedding_model_keeps_no_kv_cache(tmp_path):
    path = write_gguf(tmp_path / "e.gguf", "bert", context_length=512, pooling_type=1,
                      meta={"block_count": 6, "embedding_length": 384, "attention.head_count": 12})
    need = memory_need({"main": [path]}, {"ctx_size": -1, "llamacpp_args": "-np 8 -kvu"}, "cpu", None,
                       mode="embeddings")
    assert need is not None and need.terms == () and need.at() == need.fixed


def test_a_rule_on_file_sizes_for_engines_without_a_finer_estimate(tmp_path):
    from lemonade.backends.piper.engine import PiperEngine
    from lemonade.config import Config

    voice = tmp_path / "voice.onnx"
    voice.write_bytes(b"\0" * (10 * MiB))
    engine = PiperEngine(tmp_path, Config(tmp_path, environ={}))
    need = engine.memory_need(None, {"main": [voice]}, {}, "cpu")  # type: ignore[arg-type]
    assert need is not None and need.at() == PiperEngine.memory_base_bytes + int(1.5 * 10 * MiB)


def test_the_backends_list_hides_recipes_the_server_offers_no_model_of():
    """`lemonade backends` without --all: unsupported backends and the recipes `/v1/system-info` calls
    unavailable (every model too big for the memory the server may use) are left out."""
    from lemonade.cli.backends_cmd import supported_only

    recipes = {"llamacpp": {"backends": {"cpu": {"state": "installed"}, "rocm": {"state": "unsupported"}}},
               "sd-cpp": {"backends": {"cpu": {"state": "installable"}}}}
    assert supported_only(recipes) == {"llamacpp": {"backends": {"cpu": {"state": "installed"}}},
                                       "sd-cpp": {"backends": {"cpu": {"state": "installable"}}}}
    assert list(supported_only(recipes, ["sd-cpp"])) == ["llamacpp"]
