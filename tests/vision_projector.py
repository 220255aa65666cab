"""A random-weight Gemma 3 vision projector (mmproj GGUF) that llama-server really loads and runs.

No vision model is on any offline package index, and the suite's LLM is Gemma 3 270M, which has no
projector of its own. So this writes one at the real layout llama.cpp's `clip` reads for Gemma 3
(projector type `gemma3`: a SigLIP vision encoder, an RMS-normed average pool and the
`mm.input_projection` into the text model's 640-wide embeddings; tools/mtmd/clip.cpp and
models/siglip.cpp of the pinned b11312), only tiny: 56x56 pictures in 14-pixel patches, one
encoder block 32 wide, no pooling (`projector.scale_factor` 1), so every picture becomes 16
embeddings in the prompt. Next to Gemma's GGUF in a folder of the extra models dir it makes a model
with the `vision` label whose llama-server runs with `--mmproj`: an attached image is decoded,
encoded and counted in the prompt's tokens. Its weights are random, so what the model "sees" means
nothing; what it proves is that the picture reached the engine.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

GEMMA3_TEXT_EMBD = 640  # Gemma 3 270M's embedding width: what the projection must produce
IMAGE_SIZE, PATCH = 56, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # embeddings per picture (no pooling)


def write_vision_projector(path: Path, text_embd: int = GEMMA3_TEXT_EMBD, *, embd: int = 32, heads: int = 2,
                           ff: int = 64, blocks: int = 1, seed: int = 0) -> Path:
    """An `mmproj-*.gguf` (F32, about 200 KB) for a Gemma 3 text model of width `text_embd`."""
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:  # PyTorch (out, in) order; gguf stores it as ggml expects
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name("random-weight Gemma 3 projector (tests)")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    w.add_vision_projection_dim(text_embd)
    w.add_vision_image_size(IMAGE_SIZE)
    w.add_vision_patch_size(PATCH)
    w.add_vision_embedding_length(embd)
    w.add_vision_feed_forward_length(ff)
    w.add_vision_block_count(blocks)
    w.add_vision_head_count(heads)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_use_gelu(True)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    w.add_vision_projector_scale_factor(1)  # Gemma 3's default pools 4x4 patches into one embedding
    w.add_tensor("v.patch_embd.weight", weights(embd, 3, PATCH, PATCH))
    w.add_tensor("v.patch_embd.bias", zeros(embd))
    w.add_tensor("v.position_embd.weight", weights(IMAGE_TOKENS, embd))
    for i in range(blocks):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"v.blk.{i}.{name}.weight", weights(embd, embd))
            w.add_tensor(f"v.blk.{i}.{name}.bias", zeros(embd))
        for name in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.{i}.{name}.weight", ones(embd))
            w.add_tensor(f"v.blk.{i}.{name}.bias", zeros(embd))
        w.add_tensor(f"v.blk.{i}.ffn_up.weight", weights(ff, embd))
        w.add_tensor(f"v.blk.{i}.ffn_up.bias", zeros(ff))
        w.add_tensor(f"v.blk.{i}.ffn_down.weight", weights(embd, ff))
        w.add_tensor(f"v.blk.{i}.ffn_down.bias", zeros(embd))
    w.add_tensor("v.post_ln.weight", ones(embd))
    w.add_tensor("v.post_ln.bias", zeros(embd))
    w.add_tensor("mm.soft_emb_norm.weight", ones(embd))
    w.add_tensor("mm.input_projection.weight", weights(embd, text_embd))  # transposed in the graph
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
