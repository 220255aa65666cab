"""Random-weight image models at real architectures' tensor names and shapes, for stable-diffusion.cpp.

Real Stable Diffusion weights are gigabytes and no PyPI package ships them, so the image tests run
sd.cpp on models made here. Their pictures are noise; what they prove is the engine path: a real
`sd-server` / `sd-cli` loads a real layout, samples, decodes and writes a PNG of the asked size.

- `write_tiny_sd1`: a single-file SD 1.x checkpoint in the original (LDM) naming
  (`model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.transformer.text_model.*`),
  with the UNet of the distilled "tiny" SD 1.x models (BK-SDM-Tiny / segmind tiny-sd: one res block
  per level, three levels, no middle block), which sd.cpp detects as `SD1.x tiny UNet`. sd.cpp builds
  SD UNets at fixed widths (320 channels), so the widths are the real ones; only the weights are
  random. The layout follows sd.cpp's own block definitions (src/unet.hpp, common_block.hpp,
  auto_encoder_kl.hpp, clip.hpp). Stored float16: about 1 GB.
- `write_tiny_esrgan`: a Real-ESRGAN RRDBNet x4 (`conv_first`, `body.N.rdbK.convJ`, `conv_up1/2`,
  `conv_hr`, `conv_last`; 64 features, 32 growth channels as RealESRGAN_x4plus) with 2 RRDB blocks
  instead of 23 (sd.cpp reads the block count from the tensor names), as a PyTorch `.pth` file.
- `write_flux2_klein`: the catalog's three-file Flux.2 Klein 4B layout, each file named and laid out as
  upstream publishes it: the diffusion model in Black Forest Labs' naming (`double_blocks.N.img_attn.qkv`,
  `single_blocks.N.linear1`, the shared `double_stream_modulation_img/txt` and `single_stream_modulation`,
  no biases), the Qwen3 text encoder in Hugging Face naming (`model.layers.N.self_attn.q_proj`, q/k norms),
  and the Flux.2 VAE (LDM naming, 32 latent channels). sd.cpp reads the depths and widths of the first two
  from the tensors, so they are scaled down: 1 double and 1 single block at hidden size 256 (two heads of
  128, the width its 4-axis RoPE needs) instead of 5 and 20 at 3072; 36 layers (as Qwen3-4B: Klein reads
  layers 9, 18 and 27) at hidden size 64 instead of 2560, with Qwen3's real vocabulary, heads (32 x 128,
  8 KV heads) and head width. The VAE's widths are fixed in sd.cpp, so it is full size (84 M weights).
- `write_sdxl`: an SDXL checkpoint in the original (SGM) naming: the UNet (`model.diffusion_model.*`, with
  `label_emb`, linear projections, transformer depths 2 and 10), CLIP ViT-L (`conditioner.embedders.0.
  transformer.text_model.*`), OpenCLIP ViT-bigG (`conditioner.embedders.1.model.*`: fused `in_proj_weight`,
  `text_projection`) and the VAE (`first_stage_model.*`). sd.cpp builds SDXL at fixed sizes, so every tensor
  has its real shape (3.5 B weights); to keep the file near 2 GB it is a GGUF whose linear weights are Q4_0
  (as `sd-cli --convert --type q4_0` writes them), convolutions float16, norms float32.

Weights are drawn with a fixed seed, scaled by 1/sqrt(fan-in) so activations stay finite. The tensor
lists below follow sd.cpp's own block definitions (the file names in each function's docstring); a
missing or misshaped tensor makes sd-server refuse the load, naming it, so a load that succeeds proves
the layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

Tensors = Iterator[tuple[str, tuple[int, ...]]]


# --- building blocks (PyTorch shapes) ----------------------------------------------------------


def _linear(name: str, n_in: int, n_out: int, bias: bool = True) -> Tensors:
    yield f"{name}.weight", (n_out, n_in)
    if bias:
        yield f"{name}.bias", (n_out,)


def _conv(name: str, n_in: int, n_out: int, k: int) -> Tensors:
    yield f"{name}.weight", (n_out, n_in, k, k)
    yield f"{name}.bias", (n_out,)


def _norm(name: str, n: int) -> Tensors:
    yield f"{name}.weight", (n,)
    yield f"{name}.bias", (n,)


def _resblock(p: str, ch: int, emb: int, out: int) -> Tensors:
    """ldm ResBlock (common_block.hpp ResBlock)."""
    yield from _norm(f"{p}.in_layers.0", ch)
    yield from _conv(f"{p}.in_layers.2", ch, out, 3)
    yield from _linear(f"{p}.emb_layers.1", emb, out)
    yield from _norm(f"{p}.out_layers.0", out)
    yield from _conv(f"{p}.out_layers.3", out, out, 3)
    if ch != out:
        yield from _conv(f"{p}.skip_connection", ch, out, 1)


def _cross_attention(p: str, dim: int, ctx: int, inner: int) -> Tensors:
    yield from _linear(f"{p}.to_q", dim, inner, bias=False)
    yield from _linear(f"{p}.to_k", ctx, inner, bias=False)
    yield from _linear(f"{p}.to_v", ctx, inner, bias=False)
    yield from _linear(f"{p}.to_out.0", inner, dim)


def _spatial_transformer(p: str, ch: int, context_dim: int, depth: int = 1, linear: bool = False) -> Tensors:
    """common_block.hpp SpatialTransformer (inner dim = ch): SD 1.x has conv projections and depth 1,
    SDXL linear projections and depth 2 or 10."""
    project = _linear if linear else (lambda name, n_in, n_out: _conv(name, n_in, n_out, 1))
    yield from _norm(f"{p}.norm", ch)
    yield from project(f"{p}.proj_in", ch, ch)
    for d in range(depth):
        b = f"{p}.transformer_blocks.{d}"
        yield from _cross_attention(f"{b}.attn1", ch, ch, ch)
        yield from _cross_attention(f"{b}.attn2", ch, context_dim, ch)
        yield from _linear(f"{b}.ff.net.0.proj", ch, ch * 4 * 2)  # GEGLU
        yield from _linear(f"{b}.ff.net.2", ch * 4, ch)
        for i in (1, 2, 3):
            yield from _norm(f"{b}.norm{i}", ch)
    yield from project(f"{p}.proj_out", ch, ch)


# --- SD 1.x tiny UNet --------------------------------------------------------------------------


def _tiny_unet(p: str = "model.diffusion_model") -> Tensors:
    """unet.hpp UnetModelBlock for VERSION_SD1_TINY_UNET, index arithmetic included."""
    mc, emb, ctx = 320, 1280, 768
    mults, attn_res = (1, 2, 4), (4, 2, 1)
    yield from _linear(f"{p}.time_embed.0", mc, emb)
    yield from _linear(f"{p}.time_embed.2", emb, emb)
    yield from _conv(f"{p}.input_blocks.0.0", 4, mc, 3)
    chans, ch, idx, ds = [mc], mc, 0, 1
    for i, mult in enumerate(mults):
        idx += 1
        yield from _resblock(f"{p}.input_blocks.{idx}.0", ch, emb, mult * mc)
        ch = mult * mc
        if ds in attn_res:
            yield from _spatial_transformer(f"{p}.input_blocks.{idx}.1", ch, ctx)
        chans.append(ch)
        idx += 1  # tiny UNet: the second res block's index is skipped
        if i != len(mults) - 1:
            idx += 1
            yield from _conv(f"{p}.input_blocks.{idx}.0.op", ch, ch, 3)
            chans.append(ch)
            ds *= 2
    out_idx = 0
    for i in reversed(range(len(mults))):
        mult = mults[i]
        for j in range(2):
            ich = chans.pop()
            yield from _resblock(f"{p}.output_blocks.{out_idx}.0", ch + ich, emb, mult * mc)
            ch = mult * mc
            up_idx = 1
            if ds in attn_res:
                yield from _spatial_transformer(f"{p}.output_blocks.{out_idx}.1", ch, ctx)
                up_idx += 1
            if i > 0 and j == 1:
                out_idx += 1
                if out_idx == 2:
                    up_idx = 1
                yield from _conv(f"{p}.output_blocks.{out_idx}.{up_idx}.conv", ch, ch, 3)
                ds //= 2
            out_idx += 1
    yield from _norm(f"{p}.out.0", ch)
    yield from _conv(f"{p}.out.2", mc, 4, 3)


# --- VAE (AutoencoderKL, SD 1.x) ---------------------------------------------------------------


def _vae_resnet(p: str, n_in: int, n_out: int) -> Tensors:
    yield from _norm(f"{p}.norm1", n_in)
    yield from _conv(f"{p}.conv1", n_in, n_out, 3)
    yield from _norm(f"{p}.norm2", n_out)
    yield from _conv(f"{p}.conv2", n_out, n_out, 3)
    if n_in != n_out:
        yield from _conv(f"{p}.nin_shortcut", n_in, n_out, 1)


def _vae_mid(p: str, ch: int) -> Tensors:
    yield from _vae_resnet(f"{p}.mid.block_1", ch, ch)
    yield from _norm(f"{p}.mid.attn_1.norm", ch)
    for name in ("q", "k", "v", "proj_out"):
        yield from _conv(f"{p}.mid.attn_1.{name}", ch, ch, 1)
    yield from _vae_resnet(f"{p}.mid.block_2", ch, ch)


def _vae(p: str = "first_stage_model", z: int = 4) -> Tensors:
    """auto_encoder_kl.hpp AutoEncoderKL: 4 latent channels for SD 1.x/SDXL, 32 for Flux.2."""
    ch, mults, blocks = 128, (1, 2, 4, 4), 2
    enc = f"{p}.encoder" if p else "encoder"
    yield from _conv(f"{enc}.conv_in", 3, ch, 3)
    block_in = ch
    for i, mult in enumerate(mults):
        block_in = ch if i == 0 else ch * mults[i - 1]
        for j in range(blocks):
            yield from _vae_resnet(f"{enc}.down.{i}.block.{j}", block_in, ch * mult)
            block_in = ch * mult
        if i != len(mults) - 1:
            yield from _conv(f"{enc}.down.{i}.downsample.conv", block_in, block_in, 3)
    yield from _vae_mid(enc, block_in)
    yield from _norm(f"{enc}.norm_out", block_in)
    yield from _conv(f"{enc}.conv_out", block_in, 2 * z, 3)
    top = f"{p}." if p else ""
    yield from _conv(f"{top}quant_conv", 2 * z, 2 * z, 1)
    yield from _conv(f"{top}post_quant_conv", z, z, 1)
    dec = f"{top}decoder"
    block_in = ch * mults[-1]
    yield from _conv(f"{dec}.conv_in", z, block_in, 3)
    yield from _vae_mid(dec, block_in)
    for i in reversed(range(len(mults))):
        for j in range(blocks + 1):
            yield from _vae_resnet(f"{dec}.up.{i}.block.{j}", block_in, ch * mults[i])
            block_in = ch * mults[i]
        if i != 0:
            yield from _conv(f"{dec}.up.{i}.upsample.conv", block_in, block_in, 3)
    yield from _norm(f"{dec}.norm_out", block_in)
    yield from _conv(f"{dec}.conv_out", block_in, 3, 3)


# --- CLIP ViT-L/14 text encoder (SD 1.x) -------------------------------------------------------


def _clip_l(p: str = "cond_stage_model.transformer.text_model") -> Tensors:
    d, layers, ff = 768, 12, 3072
    yield f"{p}.embeddings.token_embedding.weight", (49408, d)
    yield f"{p}.embeddings.position_embedding.weight", (77, d)
    for i in range(layers):
        lp = f"{p}.encoder.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield from _linear(f"{lp}.self_attn.{proj}", d, d)
        yield from _norm(f"{lp}.layer_norm1", d)
        yield from _norm(f"{lp}.layer_norm2", d)
        yield from _linear(f"{lp}.mlp.fc1", d, ff)
        yield from _linear(f"{lp}.mlp.fc2", ff, d)
    yield from _norm(f"{p}.final_layer_norm", d)


# --- SDXL: UNet and OpenCLIP ViT-bigG/14 ------------------------------------------------------------


def _sdxl_unet(p: str = "model.diffusion_model") -> Tensors:
    """unet.hpp UnetModelBlock for VERSION_SDXL: 320 channels, levels x1 x2 x4, attention (64-wide heads,
    linear projections, context 2048) at the second level (depth 2) and third level and middle (depth 10),
    and the `label_emb` that takes the pooled text embedding and the size conditioning (2816)."""
    mc, emb, ctx, adm = 320, 1280, 2048, 2816
    mults, attn_res, depths = (1, 2, 4), (4, 2), (1, 2, 10)
    yield from _linear(f"{p}.time_embed.0", mc, emb)
    yield from _linear(f"{p}.time_embed.2", emb, emb)
    yield from _linear(f"{p}.label_emb.0.0", adm, emb)
    yield from _linear(f"{p}.label_emb.0.2", emb, emb)
    yield from _conv(f"{p}.input_blocks.0.0", 4, mc, 3)
    chans, ch, idx, ds = [mc], mc, 0, 1
    for i, mult in enumerate(mults):
        for _ in range(2):
            idx += 1
            yield from _resblock(f"{p}.input_blocks.{idx}.0", ch, emb, mult * mc)
            ch = mult * mc
            if ds in attn_res:
                yield from _spatial_transformer(f"{p}.input_blocks.{idx}.1", ch, ctx, depths[i], linear=True)
            chans.append(ch)
        if i != len(mults) - 1:
            idx += 1
            yield from _conv(f"{p}.input_blocks.{idx}.0.op", ch, ch, 3)
            chans.append(ch)
            ds *= 2
    yield from _resblock(f"{p}.middle_block.0", ch, emb, ch)
    yield from _spatial_transformer(f"{p}.middle_block.1", ch, ctx, depths[-1], linear=True)
    yield from _resblock(f"{p}.middle_block.2", ch, emb, ch)
    out_idx = 0
    for i in reversed(range(len(mults))):
        for j in range(3):
            yield from _resblock(f"{p}.output_blocks.{out_idx}.0", ch + chans.pop(), emb, mults[i] * mc)
            ch = mults[i] * mc
            up_idx = 1
            if ds in attn_res:
                yield from _spatial_transformer(f"{p}.output_blocks.{out_idx}.1", ch, ctx, depths[i], linear=True)
                up_idx += 1
            if i > 0 and j == 2:
                yield from _conv(f"{p}.output_blocks.{out_idx}.{up_idx}.conv", ch, ch, 3)
                ds //= 2
            out_idx += 1
    yield from _norm(f"{p}.out.0", ch)
    yield from _conv(f"{p}.out.2", mc, 4, 3)


def _open_clip_bigg(p: str = "conditioner.embedders.1.model") -> Tensors:
    """OpenCLIP ViT-bigG/14's text tower in open_clip's own naming, as SDXL checkpoints carry it (sd.cpp's
    name_conversion.cpp maps it onto clip.hpp's OPEN_CLIP_VIT_BIGG_14: 32 layers, width 1280, fused QKV)."""
    d, layers, ff = 1280, 32, 5120
    yield f"{p}.token_embedding.weight", (49408, d)
    yield f"{p}.positional_embedding", (77, d)
    for i in range(layers):
        lp = f"{p}.transformer.resblocks.{i}"
        yield from _norm(f"{lp}.ln_1", d)
        yield f"{lp}.attn.in_proj_weight", (3 * d, d)
        yield f"{lp}.attn.in_proj_bias", (3 * d,)
        yield from _linear(f"{lp}.attn.out_proj", d, d)
        yield from _norm(f"{lp}.ln_2", d)
        yield from _linear(f"{lp}.mlp.c_fc", d, ff)
        yield from _linear(f"{lp}.mlp.c_proj", ff, d)
    yield from _norm(f"{p}.ln_final", d)
    yield f"{p}.text_projection", (d, d)


def sdxl_tensors() -> Tensors:
    yield from _sdxl_unet()
    yield from _clip_l("conditioner.embedders.0.transformer.text_model")
    yield from _open_clip_bigg()
    yield from _vae()


# --- Flux.2 Klein: diffusion model, Qwen3 text encoder ------------------------------------------------


def _flux2(hidden: int = 256, double: int = 1, single: int = 1, context: int = 192) -> Tensors:
    """flux.hpp Flux for VERSION_FLUX2_KLEIN, in Black Forest Labs' file naming (sd.cpp loads a
    `--diffusion-model` under `model.diffusion_model.`): 128 latent channels in and out, no biases,
    MLP ratio 3 with a SiLU-gated first layer (hence 2 x 3 x hidden), RMS q/k norms per 128-wide head,
    modulation shared by all blocks, no guidance embedding (the distilled Klein has none)."""
    latent, head, mlp = 128, 128, 3 * hidden
    yield "img_in.weight", (hidden, latent)
    yield "time_in.in_layer.weight", (hidden, 256)
    yield "time_in.out_layer.weight", (hidden, hidden)
    yield "txt_in.weight", (hidden, context)
    for i in range(double):
        for stream in ("img", "txt"):
            b = f"double_blocks.{i}.{stream}"
            yield f"{b}_attn.qkv.weight", (3 * hidden, hidden)
            yield f"{b}_attn.norm.query_norm.scale", (head,)
            yield f"{b}_attn.norm.key_norm.scale", (head,)
            yield f"{b}_attn.proj.weight", (hidden, hidden)
            yield f"{b}_mlp.0.weight", (2 * mlp, hidden)
            yield f"{b}_mlp.2.weight", (hidden, mlp)
    for i in range(single):
        b = f"single_blocks.{i}"
        yield f"{b}.linear1.weight", (3 * hidden + 2 * mlp, hidden)
        yield f"{b}.linear2.weight", (hidden, hidden + mlp)
        yield f"{b}.norm.query_norm.scale", (head,)
        yield f"{b}.norm.key_norm.scale", (head,)
    yield "double_stream_modulation_img.lin.weight", (6 * hidden, hidden)
    yield "double_stream_modulation_txt.lin.weight", (6 * hidden, hidden)
    yield "single_stream_modulation.lin.weight", (3 * hidden, hidden)
    yield "final_layer.linear.weight", (latent, hidden)
    yield "final_layer.adaLN_modulation.1.weight", (2 * hidden, hidden)


def _qwen3(hidden: int = 64, layers: int = 36, intermediate: int = 128, vocab: int = 151936) -> Tensors:
    """llm.hpp's QWEN3 text model in Hugging Face naming (loaded under `text_encoders.llm.`): 32 query
    heads and 8 key/value heads of 128 (fixed in sd.cpp), RMS q/k norms, a SiLU-gated MLP, no biases."""
    heads, kv_heads, head = 32, 8, 128
    yield "model.embed_tokens.weight", (vocab, hidden)
    for i in range(layers):
        lp = f"model.layers.{i}"
        yield f"{lp}.input_layernorm.weight", (hidden,)
        yield f"{lp}.self_attn.q_proj.weight", (heads * head, hidden)
        yield f"{lp}.self_attn.k_proj.weight", (kv_heads * head, hidden)
        yield f"{lp}.self_attn.v_proj.weight", (kv_heads * head, hidden)
        yield f"{lp}.self_attn.o_proj.weight", (hidden, heads * head)
        yield f"{lp}.self_attn.q_norm.weight", (head,)
        yield f"{lp}.self_attn.k_norm.weight", (head,)
        yield f"{lp}.post_attention_layernorm.weight", (hidden,)
        yield f"{lp}.mlp.gate_proj.weight", (intermediate, hidden)
        yield f"{lp}.mlp.up_proj.weight", (intermediate, hidden)
        yield f"{lp}.mlp.down_proj.weight", (hidden, intermediate)
    yield "model.norm.weight", (hidden,)


def _values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm weights 1, biases 0, everything else N(0, 1/fan_in), so activations stay finite."""
    if len(shape) == 1:
        is_norm_weight = name.endswith((".weight", ".scale"))
        return np.full(shape, 1.0 if is_norm_weight else 0.0, dtype=np.float16)
    fan_in = int(np.prod(shape[1:])) if "embedding" not in name else 1
    scale = 0.02 if "embedding" in name else 1.0 / np.sqrt(fan_in)
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float16)


def _write_safetensors(path: Path, tensors: Tensors, seed: int) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    data = {name: _values(name, shape, rng) for name, shape in tensors}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    save_file(data, str(tmp), metadata={"format": "pt", "note": "random weights for tests (tests/sd_factory.py)"})
    os.replace(tmp, path)
    return path


def sd1_tiny_tensors() -> Tensors:
    yield from _tiny_unet()
    yield from _vae()
    yield from _clip_l()


def write_tiny_sd1(path: Path, seed: int = 0) -> Path:
    """An SD 1.x tiny-UNet checkpoint (single .safetensors file) at `path`, written atomically."""
    return _write_safetensors(path, sd1_tiny_tensors(), seed)


def _q4_0_blocks(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random Q4_0 rows (per 32 weights: a float16 scale, then 16 bytes of 4-bit values): drawn as bytes
    rather than quantized from floats, which would take minutes for SDXL's 3 B linear weights. The scale
    gives the weights a standard deviation of about 1/sqrt(fan-in), like `_values`."""
    rows, cols = shape
    blocks = rows * cols // 32
    out = np.empty((blocks, 18), dtype=np.uint8)
    scale = np.float16(1.0 / (4.6 * np.sqrt(cols)))  # 4-bit values -8..7 have a std of about 4.6
    out[:, :2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    out[:, 2:] = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return out.reshape(rows, cols // 32 * 18)


def _is_linear_weight(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith("weight") and "embedding" not in name and shape[1] % 32 == 0


def _write_gguf_q4_0(path: Path, tensors: Tensors, seed: int) -> Path:
    """A GGUF of `tensors` (names and PyTorch shapes as given): linear weights Q4_0, other weights float16,
    norms and biases float32."""
    import gguf

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch="sdxl", use_temp_file=True)
    writer.add_string("general.description", "random weights for tests (tests/sd_factory.py)")
    for name, shape in tensors:
        if _is_linear_weight(name, shape):
            writer.add_tensor(name, _q4_0_blocks(shape, rng), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        else:
            values = _values(name, shape, rng)
            writer.add_tensor(name, values.astype(np.float32) if len(shape) == 1 else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def write_sdxl(path: Path, seed: int = 0) -> Path:
    """An SDXL checkpoint at its real shapes, as a GGUF (see the module docstring)."""
    return _write_gguf_q4_0(path, sdxl_tensors(), seed)


KLEIN_SPLIT = "Comfy-Org/vae-text-encorder-for-flux-klein-4b"
FLUX2_KLEIN_FILES = {  # the catalog's Flux-2-Klein-4B checkpoints: role -> (repository, file)
    "main": ("black-forest-labs/FLUX.2-klein-4B", "flux-2-klein-4b.safetensors"),
    "text_encoder": (KLEIN_SPLIT, "split_files/text_encoders/qwen_3_4b.safetensors"),
    "vae": (KLEIN_SPLIT, "split_files/vae/flux2-vae.safetensors"),
}


def write_flux2_klein(role: str, path: Path, seed: int = 0) -> Path:
    """One of Flux.2 Klein's three files (`main`, `text_encoder` or `vae`) at `path` (module docstring)."""
    tensors = {"main": _flux2(), "text_encoder": _qwen3(), "vae": _vae("", z=32)}[role]
    return _write_safetensors(path, tensors, seed)


def esrgan_tensors(num_block: int = 2, feat: int = 64, grow: int = 32) -> Tensors:
    yield from _conv("conv_first", 3, feat, 3)
    for b in range(num_block):
        for r in (1, 2, 3):
            p = f"body.{b}.rdb{r}"
            for c in range(1, 5):
                yield from _conv(f"{p}.conv{c}", feat + (c - 1) * grow, grow, 3)
            yield from _conv(f"{p}.conv5", feat + 4 * grow, feat, 3)
    for name in ("conv_body", "conv_up1", "conv_up2", "conv_hr"):
        yield from _conv(name, feat, feat, 3)
    yield from _conv("conv_last", feat, 3, 3)


def write_tiny_esrgan(path: Path, seed: int = 0) -> Path:
    """A Real-ESRGAN x4 RRDBNet (.pth, PyTorch zip format as the real RealESRGAN_x4plus.pth)."""
    import torch

    rng = np.random.default_rng(seed)
    state = {name: torch.from_numpy(_values(name, shape, rng).astype(np.float32) * 0.1)
             for name, shape in esrgan_tensors()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(state, str(tmp))
    os.replace(tmp, path)
    return path


# --- cached under $LEMONADE_TEST_CACHE (regenerated when this generator changes) -------------------

SD_FILE = "tiny-sd1.safetensors"
ESRGAN_FILE = "RealESRGAN_x4plus.pth"
SDXL_FILE = "random-sdxl-Q4_0.gguf"


def _key(label: str) -> str:
    """Bump the label's version when a layout above changes (the SD file takes minutes to write on a
    busy disk, so unrelated edits of this module must not regenerate it)."""
    from tests.models import _digest

    return _digest([label.encode(), np.__version__.encode()])


def tiny_sd1_model() -> Path:
    """The cached random-weight SD 1.x tiny-UNet checkpoint (about 1 GB; built once, ~20 s)."""
    from tests.models import _cached

    return _cached("tiny-sd1", _key("tiny-sd1-v1"), SD_FILE, lambda tmp, _folder: write_tiny_sd1(tmp))


def tiny_esrgan_model() -> Path:
    """The cached random-weight Real-ESRGAN x4 model (.pth, about 2 MB)."""
    from tests.models import _cached

    return _cached("tiny-esrgan", _key("tiny-esrgan-v1"), ESRGAN_FILE, lambda tmp, _folder: write_tiny_esrgan(tmp))


def sdxl_model() -> Path:
    """The cached random-weight SDXL checkpoint (a GGUF of about 2 GB; built once)."""
    from tests.models import _cached

    return _cached("random-sdxl", _key("random-sdxl-v1"), SDXL_FILE, lambda tmp, _folder: write_sdxl(tmp))


def flux2_klein_model() -> dict[str, Path]:
    """The cached random-weight Flux.2 Klein files, role -> path (about 250 MB together, the VAE most)."""
    from tests.models import _cached

    return {role: _cached(f"flux2-klein-{role}", _key(f"flux2-klein-{role}-v1"), Path(name).name,
                          lambda tmp, _folder, role=role: write_flux2_klein(role, tmp))
            for role, (_repo, name) in FLUX2_KLEIN_FILES.items()}


# ----- the models on the local hub ----------------------------------------------------------------------

SD_REPO = "test-org/tiny-sd1"
ESRGAN_REPO = "amd/realesrgan-x4plus"  # the catalog's RealESRGAN-x4plus: amd/realesrgan-x4plus:RealESRGAN_x4plus.pth
SDXL_REPO = "test-org/random-sdxl"


def publish_sd(hub) -> None:
    """The random-weight models as hub files (hard links: the SD file is 1 GB), downloaded by the
    server with the real huggingface_hub."""
    flux2 = flux2_klein_model()
    files = [(SD_REPO, SD_FILE, tiny_sd1_model()), (ESRGAN_REPO, ESRGAN_FILE, tiny_esrgan_model()),
             (SDXL_REPO, SDXL_FILE, sdxl_model())]
    files += [(repo, name, flux2[role]) for role, (repo, name) in FLUX2_KLEIN_FILES.items()]
    for repo, name, source in files:
        target = hub.scratch / repo / name
        if not target.is_file():
            hub.create_repo(repo, {})
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
