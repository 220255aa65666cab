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

Weights are drawn with a fixed seed, scaled by 1/sqrt(fan-in) so activations stay finite.
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


def _spatial_transformer(p: str, ch: int, context_dim: int) -> Tensors:
    """SpatialTransformer with conv projections (SD 1.x), depth 1, 8 heads (inner dim = ch)."""
    yield from _norm(f"{p}.norm", ch)
    yield from _conv(f"{p}.proj_in", ch, ch, 1)
    b = f"{p}.transformer_blocks.0"
    yield from _cross_attention(f"{b}.attn1", ch, ch, ch)
    yield from _cross_attention(f"{b}.attn2", ch, context_dim, ch)
    yield from _linear(f"{b}.ff.net.0.proj", ch, ch * 4 * 2)  # GEGLU
    yield from _linear(f"{b}.ff.net.2", ch * 4, ch)
    for i in (1, 2, 3):
        yield from _norm(f"{b}.norm{i}", ch)
    yield from _conv(f"{p}.proj_out", ch, ch, 1)


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


def _vae(p: str = "first_stage_model") -> Tensors:
    ch, mults, blocks, z = 128, (1, 2, 4, 4), 2, 4
    enc = f"{p}.encoder"
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
    yield from _conv(f"{p}.quant_conv", 2 * z, 2 * z, 1)
    yield from _conv(f"{p}.post_quant_conv", z, z, 1)
    dec = f"{p}.decoder"
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


def _values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm weights 1, biases 0, everything else N(0, 1/fan_in), so activations stay finite."""
    if len(shape) == 1:
        is_norm_weight = name.endswith(".weight")
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
