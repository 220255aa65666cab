"""The model architectures the pinned llama.cpp can load, and the refusal for the others.

llama-server started on a GGUF whose `general.architecture` it does not know fails deep in its load
(`unknown model architecture`), after the download and the wait. Lemonade refuses such a model before
that, with a 400 naming the architecture and what to do: from the catalog entry's `architecture`
before anything is downloaded, and from the GGUF header itself at load for any model (registered,
extra models dir, built-in). A `system` llama-server is exempt: it is whatever version the user put
on PATH, maybe a newer one that knows the architecture.

KNOWN is `LLM_ARCH_NAMES` of `src/llama-arch.cpp` in the pinned sources (b11312; the
`llama-cpp-python` sdist's `vendor/llama.cpp`), without `clip` (a projector, never a model of its own);
tests/test_catalog_entries.py checks it against those sources when they are on disk.
"""

from __future__ import annotations

from lemonade.backends.llamacpp.build import LLAMA_CPP_VERSION

KNOWN = frozenset("""
    llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert
    nomic-bert nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2
    qwen2moe qwen2vl qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe qwen4exp phi2 phi3
    phimoe plamo plamo2 plamo3 codeshell orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n
    gemma4 gemma4-assistant gemma-embedding starcoder2 mamba mamba2 maple jamba falcon-h1 xverse
    command-r cohere2 cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm arctic deepseek deepseek2
    deepseek2-ocr deepseek32 deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 t5encoder jais jais2
    nemotron nemotron_h nemotron_h_moe exaone exaone4 exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite
    granitemoe granitehybrid graniteswitch granite_swa chameleon wavtokenizer-dec plm bailingmoe
    bailingmoe2 bailingmoe3 dots1 dots3note arcee afmoe laguna ernie4_5 ernie4_5-moe hunyuan-moe
    hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3 gpt-oss lfm2 lfm2moe dream smallthinker llada llada-moe
    seed_oss grovemoe apertus minimax-01 hrm_text minimax-m2 minimax-m3 cogvlm rnd1 pangu-embedded
    mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35 spark2_5 llama-embed maincoder kimi-linear
    kimi-k3 glm5-next talkie mellum nanbeige qwen3tts pockettts
""".split())


def refusal(model_name: str, architecture: str, where: str) -> str | None:
    """Why `model_name` cannot be loaded by the pinned llama.cpp, None when it can. `where` says where
    the architecture was read (the catalog, or the GGUF file's header)."""
    if architecture in KNOWN:
        return None
    return (f"{model_name} is a '{architecture}' model ({where}), an architecture the llama.cpp this Lemonade "
            f"runs ({LLAMA_CPP_VERSION}) cannot load. Put a llama-server that knows it on PATH (a newer llama.cpp "
            "release) and load the model with llamacpp_backend=system (or set llamacpp.prefer_system=true), or "
            "choose another model.")
