from __future__ import annotations

import pytest

from loraplex.engine.demo_model import create_random_checkpoint

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.1,
)

# name -> (arch, overrides)
MODEL_VARIANTS = {
    "llama_gqa": ("llama", dict(TINY)),
    "llama_mha": ("llama", dict(TINY, num_key_value_heads=4)),
    "llama3_rope_tied": (
        "llama",
        dict(
            TINY,
            tie_word_embeddings=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "qwen2_bias": ("qwen2", dict(TINY)),
    # bf16 checkpoints: served in float32 their weights are bf16-exact, so the native CPU kernels
    # keep a packed bf16 copy and run decode-sized linears on it (kernels/csrc/cpu_linear.cpp).
    "qwen2_bias_bf16": ("qwen2", dict(TINY, dtype="bfloat16")),
    "llama3_rope_tied_bf16": ("llama", dict(TINY, tie_word_embeddings=True, dtype="bfloat16")),
    "mistral": ("mistral", dict(TINY, num_key_value_heads=1, head_dim=16)),
}


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    cache: dict[str, str] = {}

    def make(name: str) -> str:
        if name not in cache:
            arch, overrides = MODEL_VARIANTS[name]
            overrides = dict(overrides)
            tie = overrides.pop("tie_word_embeddings", False)
            path = tmp_path_factory.mktemp(name)
            create_random_checkpoint(path, arch=arch, preset="demo", seed=7, tie_word_embeddings=tie, **overrides)
            cache[name] = str(path)
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_llama(model_factory) -> str:
    return model_factory("llama_gqa")
