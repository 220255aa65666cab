"""Where a model's layers go over llama.cpp RPC workers (backends/llamacpp/split.py, llamacpp.rpc.decide) and
what each host holds (llamacpp.memory.split_need), on figures and tiny GGUFs: no engine.

The end-to-end proof is tests/test_rpc_split.py (the real llama-server and rpc-servers in memory-capped
network namespaces); these check the rules in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lemonade.backends.engine import MemoryNeed
from lemonade.backends.llamacpp.memory import LayerCost, SplitNeed, memory_need, split_need
from lemonade.backends.llamacpp.rpc import decide, user_places_layers
from lemonade.backends.llamacpp.split import OUTPUT_ON_HOST, Device, largest_context, place, split_args
from lemonade.errors import APIError
from tests.gguf_factory import write_gguf

MiB = 1 << 20
GEMMA3 = {"block_count": 18, "embedding_length": 640, "feed_forward_length": 2048, "attention.head_count": 4,
          "attention.head_count_kv": 1, "attention.key_length": 256, "attention.value_length": 256,
          "attention.sliding_window": 512}


def need(layers: int = 18, weights: int = 10 * MiB, kv_rate: float = 1024.0, fixed: int = 20 * MiB,
         ctx: int = 8192, ctx_min: int | None = 2048) -> SplitNeed:
    """Equal layers, full attention, `kv_rate` bytes per cell each."""
    main = MemoryNeed(100 * MiB, ((2048.0, None),), ctx, ctx_min, {"input_output_weights": 100 * MiB})
    return SplitNeed(main, tuple(LayerCost(weights, weights // 4, kv_rate, False) for _ in range(layers)), fixed,
                     0.0, None)


def devices(*free_mib: int) -> list[Device]:
    return [Device(f"10.0.0.{i + 2}:50052", "CPU", f * MiB) for i, f in enumerate(free_mib)]


def test_a_device_holds_its_layers_weights_kv_its_largest_tensor_while_it_arrives_and_a_compute_buffer():
    n = need()
    one = 10 * MiB + 10 * MiB // 4 + 1024 * 4096 + 20 * MiB
    assert n.device_bytes(0, 1, 4096) == one
    assert n.device_bytes(0, 3, 4096) == 3 * 10 * MiB + 10 * MiB // 4 + 3 * 1024 * 4096 + 20 * MiB
    assert n.device_bytes(5, 0, 4096) == 0


def test_layers_go_in_proportion_to_free_memory_and_no_device_gets_more_than_it_has():
    n = need()
    equal = place(n, devices(200, 200, 200), 4096)
    assert equal is not None and equal.counts == (6, 6, 6)
    uneven = place(n, devices(400, 200, 200), 4096)
    assert uneven is not None and sum(uneven.counts) == 18
    assert uneven.counts[0] > uneven.counts[1] and uneven.counts[0] > uneven.counts[2]
    for dev, share in zip(uneven.devices, uneven.shares, strict=True):
        assert share <= dev.free
    assert uneven.workers == [d.worker for d in uneven.devices]


def test_a_worker_whose_devices_get_no_layer_is_left_out_of_the_rpc_list():
    n = need()
    placement = place(n, devices(10, 400, 400), 4096)  # 10 MiB: not even one layer's compute buffer
    assert placement is not None and placement.counts[0] == 0
    assert placement.workers == ["10.0.0.3:50052", "10.0.0.4:50052"]
    # one count per device of the --rpc workers; the last also counts the output layer, kept here by -ot
    ts = split_args(placement)
    assert ts[:2] == ["--tensor-split", f"{placement.counts[1]},{placement.counts[2] + 1}"]
    assert ts[2:] == ["--override-tensor", OUTPUT_ON_HOST]


def test_when_the_proportional_split_overflows_a_device_the_layers_are_filled_in_order():
    # a worker with little room but a large share of the total is not given more than it holds
    n = need(layers=4, weights=50 * MiB, kv_rate=0.0, fixed=0)
    placement = place(n, devices(130, 130, 60), 4096)
    assert placement is not None and sum(placement.counts) == 4
    assert all(share <= dev.free for dev, share in zip(placement.devices, placement.shares, strict=True))


def test_nothing_is_placed_where_the_devices_cannot_hold_every_layer():
    assert place(need(), devices(50, 50), 4096) is None
    assert place(need(), [], 4096) is None


def test_the_largest_context_the_devices_hold_is_found_in_steps_of_the_cache_granularity():
    n = need(kv_rate=2048.0)
    devs = devices(150, 150, 150)
    best = largest_context(n, devs, 2048, 65536)
    assert best is not None and 2048 <= best < 65536 and best % MemoryNeed.ALIGN == 0
    assert place(n, devs, best) is not None and place(n, devs, best + MemoryNeed.ALIGN) is None
    assert largest_context(n, devices(400, 400, 400), 2048, 8192) == 8192
    assert largest_context(n, devices(20, 20), 2048, 8192) is None


def test_workers_that_cannot_hold_the_model_are_refused_with_each_ones_shortfall():
    devs = devices(60, 90)
    with pytest.raises(APIError) as refused:
        decide("big-model", need(ctx=8192, ctx_min=2048), devs)
    err = refused.value
    assert err.status == 507 and err.code == "insufficient_memory"
    for dev in devs:
        assert f"{dev.worker} (CPU) would hold" in err.message
    assert err.message.count("short") == 2  # both are short
    assert "2048 tokens" in err.message and "more workers" in err.message  # not even the smallest context
    assert "a smaller ctx_size" not in err.message  # the context was not fixed by the user
    assert [w["address"] for w in err.extra["rpc_workers"]] == [d.worker for d in devs]
    assert [w["free_bytes"] for w in err.extra["rpc_workers"]] == [60 * MiB, 90 * MiB]


def test_a_fixed_context_that_does_not_fit_says_a_smaller_one_might():
    with pytest.raises(APIError) as refused:
        decide("big-model", need(ctx=65536, ctx_min=None, kv_rate=2048.0), devices(150, 150, 150))
    assert "a smaller ctx_size" in refused.value.message and "65536 tokens" in refused.value.message


def test_with_an_automatic_context_the_main_share_asks_no_more_than_the_workers_hold():
    n = need(kv_rate=2048.0, ctx=32768, ctx_min=2048)
    shared, placement = decide("m", n, devices(150, 150, 150))
    assert placement.ctx < 32768
    assert shared.main.ctx == placement.ctx and shared.main.ctx_min == 2048
    roomy, placement = decide("m", n, devices(4000, 4000))
    assert placement.ctx == 32768 and roomy.main.ctx == 32768


def test_layer_placing_flags_of_the_user_leave_the_split_to_them():
    assert user_places_layers("-ts 1,1")
    assert user_places_layers("--tensor-split=3,1 -c 4096")
    assert user_places_layers("-ot blk\\.1\\.=CPU")
    assert not user_places_layers("-c 4096 --no-repack")
    assert not user_places_layers("'unbalanced")


def _gemma_like(tmp_path: Path) -> dict[str, list[Path]]:
    tensors = {"token_embd.weight": 64 * 1024, "output_norm.weight": 640}
    for il in range(18):
        tensors |= {f"blk.{il}.attn_q.weight": 4096 + 8 * il, f"blk.{il}.ffn_up.weight": 8192}
    return {"main": [write_gguf(tmp_path / "g.gguf", "gemma3", context_length=32768, meta=GEMMA3, tensors=tensors)]}


def test_split_need_reads_each_layer_from_the_file_and_keeps_the_input_and_output_layers_on_the_main_host(tmp_path):
    files = _gemma_like(tmp_path)
    n = split_need(files, {"ctx_size": 4096}, "cpu")
    assert n is not None and len(n.layers) == 18
    for il, layer in enumerate(n.layers):
        assert layer.weights == 4 * (4096 + 8 * il + 8192) and layer.largest == 4 * 8192
        row = 1 * (256 + 256) * 2  # one KV head, f16 K and V
        assert layer.kv_rate == row
        assert layer.windowed == (il % 6 != 5)  # Gemma 3: five sliding-window layers, then a full one
    assert n.main.parts["input_output_weights"] == 4 * (64 * 1024 + 640)
    assert n.window_cells is not None and n.window_cells < 4096
    # the main host's share is less than the whole load's: the layers and their cache are elsewhere
    whole = memory_need(files, {"ctx_size": 4096}, "cpu")
    assert whole is not None and n.main.at(4096) < whole.at(4096)
    # the full-attention layers' cache grows with the context, the windowed ones' does not past the window
    assert n.device_bytes(5, 1, 8192) > n.device_bytes(5, 1, 4096)
    assert n.device_bytes(0, 1, 8192) == n.device_bytes(0, 1, 4096)


def test_split_need_cannot_be_told_without_per_layer_tensors(tmp_path):
    files = {"main": [write_gguf(tmp_path / "flat.gguf", "gemma3", meta=GEMMA3)]}
    assert split_need(files, {}, "cpu") is None
