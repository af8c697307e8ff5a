"""``quantization="int4"`` through the engine: its logits are those of the float32 HF model whose
decoder linears hold the int4-dequantized weights (and whose head/embedding hold the per-row int8
ones), so the engine wires the codes it made into the right layers, in the right order (fused
q|k|v and gate|up), with the right group size. The codes' own accuracy against a float64 oracle is
tests/kernels/test_kernels_int4.py's."""

from __future__ import annotations

import random

import pytest
from quant_testlib import hf_logits, int4_dequantized_checkpoint, prefill_logits

from loraplex.engine import LLM, EngineConfig
from loraplex.engine.models.quantization import weight_bytes


def _tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, vocab) for _ in range(n)]


@pytest.mark.parametrize("variant", ["llama_gqa", "qwen2_bias", "llama3_rope_tied"])
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_int4_logits_are_the_dequantized_models(model_factory, tmp_path, variant, backend):
    model_dir = model_factory(variant)
    group = 32
    int4 = LLM(
        model=model_dir, dtype="float32", quantization="int4", quantization_group_size=group, kernel_backend=backend
    )
    fp32 = LLM(model=model_dir, dtype="float32", kernel_backend="torch")
    ratio = weight_bytes(int4.engine.runner.model) / weight_bytes(fp32.engine.runner.model)
    assert ratio <= 0.4, f"int4 weights are {ratio:.2f}x fp32"
    toks = _tokens(40, 700)
    ref = hf_logits(int4_dequantized_checkpoint(model_dir, tmp_path / "deq", group), toks)
    ours = prefill_logits(int4, toks)
    # Same numbers up to summation order; a wrong layer, group or zero point is off by far more
    # (the plain fp32 model, the control below, differs by the quantization error itself).
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    control = ((prefill_logits(fp32, toks) - ref).abs().max() / ref.abs().max()).item()
    assert rel <= 1e-3 < control, (rel, control)
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("bad", [0, 16, 48, 100, "128"])
def test_int4_group_size_is_validated(tiny_llama, bad):
    with pytest.raises(ValueError, match="group"):
        EngineConfig(model=tiny_llama, quantization="int4", quantization_group_size=bad)
