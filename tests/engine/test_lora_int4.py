"""LoRA adapters on an INT4 base: one engine batch mixing adapters of different ranks and targets
(and requests without one) equals ``peft`` on the HF model holding the int4 base's dequantized
weights, per request. The adapter runs in the activation dtype on top of the int4 matmul: applying
it to anything but the dequantized base, dropping it, or scaling it wrongly is off by far more
than the tolerance, which the controls below show on the same inputs.

Three int4 bases: ``quantization="int4"`` at load (group 32; decoder codes and the per-row int8
head as ``quant_testlib.int4_dequantized_checkpoint`` rebuilds them), an AWQ checkpoint and an
act-order GPTQ checkpoint packed by ``gptq_awq_testlib`` (their oracle is the test's own float64
dequantization)."""

from __future__ import annotations

import pytest
import torch
from gptq_awq_testlib import write_quantized_checkpoint
from lora_testlib import PeftOracle, assert_mixed_batch_matches_peft, make_adapters, make_prompts
from quant_testlib import int4_dequantized_checkpoint, prefill_logits

from loraplex.engine import LLM

TOL = 1e-4  # relative max logit error: summation order only (measured ~1e-6 with float32 adapters)
TIE = 0.02  # logits: what the bf16 decode head may reorder (measured gaps of ~5e-4)


# The checkpoint bases run in the whole suite (the inner loop keeps the base quantized at load).
@pytest.fixture(
    scope="module",
    params=["int4_at_load", *(pytest.param(b, marks=pytest.mark.slow) for b in ("awq_checkpoint", "gptq_act_order"))],
)
def setup(request, model_factory, tmp_path_factory):
    float_dir = model_factory("llama_gqa")
    root = tmp_path_factory.mktemp(f"lora_int4_{request.param}")
    adapters = make_adapters(float_dir, root / "adapters")
    if request.param == "int4_at_load":
        engine_dir, kwargs = float_dir, dict(quantization="int4", quantization_group_size=32)
        oracle_dir = int4_dequantized_checkpoint(float_dir, root / "oracle", 32)
    else:
        # act-order: the int4 matmul reads a permuted input, the adapter the input in its own order
        fmt, order = ("gptq", "shared") if request.param == "gptq_act_order" else ("awq", None)
        engine_dir, dequantized = write_quantized_checkpoint(
            float_dir, root / fmt, fmt, 32, desc_act=order is not None, act_order=order, seed=4
        )
        dequantized.save_pretrained(root / "oracle", safe_serialization=True)
        oracle_dir, kwargs = str(root / "oracle"), {}
    llm = LLM(
        model=engine_dir,
        dtype="float32",
        kernel_backend="cpu",  # the native int4 kernels: direct for decode rows, dequantize + GEMM for chunks
        max_num_seqs=8,
        max_num_batched_tokens=32,  # chunks the longer prompts: prefill chunks and decodes share steps
        block_size=4,
        max_loras=8,
        max_cpu_loras=8,
        max_lora_rank=16,
        # The adapters' own float32 weights: "auto" stores them in float16 beside a float32 model
        # where the native SGMV converts float16 in registers (AVX-512), ~1e-3 of the logits
        # (measured 6e-4 to 1.1e-3 here), which would hide a small error under the tolerance.
        lora_dtype="model",
        **kwargs,
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    return llm, float_dir, adapters, PeftOracle(oracle_dir, adapters)


def test_mixed_adapter_batch_on_int4_matches_peft(setup):
    """Every token the engine picks is PEFT's greedy choice on the same prefix, up to a near-tie of
    TIE logits: the int8 head of ``quantization="int4"`` runs decode-sized rows through
    ``_weight_int8pack_mm`` in bf16 (kernels/int8.py), a ~1e-3 rounding of the logits that can
    flip a tie. A skipped or misapplied adapter picks tokens far below PEFT's best."""
    llm, _, _, oracle = setup
    assert llm.engine.runner.model.layers[0].mlp.down_proj.int4_weight() is not None
    assert_mixed_batch_matches_peft(llm, oracle, TIE)


@pytest.mark.parametrize("adapter", ["attn_r8", "all_r16_rslora", "qv_down_patterns"])
def test_adapter_logits_on_int4_match_peft(setup, adapter):
    llm, float_dir, adapters, oracle = setup
    toks = make_prompts(1, 700, seed=7, lengths=(24,))[0]
    with torch.inference_mode():
        oracle.model.set_adapter(adapter)
        ref = oracle.model(torch.tensor([toks])).logits[0].float()
        with oracle.model.disable_adapter():
            ref_base = oracle.model(torch.tensor([toks])).logits[0].float()
    ours = prefill_logits(llm, toks, adapter=adapter)
    scale = ref.abs().max()
    rel = ((ours - ref).abs().max() / scale).item()
    # Controls: the adapter skipped (the int4 base alone), and the adapter on the float base (PEFT
    # on the unquantized checkpoint): each is farther from the oracle than the tolerance.
    skipped = ((prefill_logits(llm, toks) - ref).abs().max() / scale).item()
    float_base = PeftOracle(float_dir, {adapter: adapters[adapter]})
    with torch.inference_mode():
        on_float = float_base.model(torch.tensor([toks])).logits[0].float()
    wrong_base = ((on_float - ref).abs().max() / scale).item()
    assert (ref - ref_base).abs().max() > 0.1, "the adapter must visibly change the logits"
    assert rel <= TOL < min(skipped, wrong_base), (rel, skipped, wrong_base)
