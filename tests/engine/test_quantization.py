"""INT8 weight-only quantization end to end: memory, logits against the fp32 Hugging Face model,
LoRA on top of int8 base weights against PEFT, the Triton int8 path, and config validation.

Stated tolerance (measured on these random models: 2-4% with int8, 1-2% with plain bf16): every
logit within 6% of the largest fp32 logit, and the teacher-forced argmax equal to fp32's at >= 90%
of positions. Prompts of 12 tokens run the decode-sized int8 path (``_weight_int8pack_mm``), 40
tokens the prefill-sized one.
"""

from __future__ import annotations

import random

import pytest
import torch
from hf_oracle import hf_greedy
from lora_testlib import PeftOracle, make_peft_adapter
from quant_testlib import hf_logits, prefill_logits

from loraplex.engine import LLM, EngineConfig, SamplingParams
from loraplex.engine.models.quantization import weight_bytes

VARIANTS = ["llama_gqa", "llama_mha", "llama3_rope_tied", "qwen2_bias", "mistral"]
LOGIT_TOL = 0.06
ARGMAX_MIN = 0.9


def _tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, vocab) for _ in range(n)]


def _close(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return rel, agree


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_weights_and_logits_vs_fp32(model_factory, variant):
    model_dir = model_factory(variant)
    fp32 = LLM(model=model_dir, dtype="float32", kernel_backend="torch")
    int8 = LLM(model=model_dir, dtype="float32", quantization="int8", kernel_backend="torch")
    ratio = weight_bytes(int8.engine.runner.model) / weight_bytes(fp32.engine.runner.model)
    assert ratio <= 0.55, f"int8 weights are {ratio:.2f}x fp32"
    assert all(p.dtype != torch.float32 or p.dim() == 1 for p in int8.engine.runner.model.parameters()), (
        "only norms/biases may stay in float"
    )
    toks = _tokens(40, 700)
    ref = hf_logits(model_dir, toks)
    for n in (12, 40):
        rel, agree = _close(prefill_logits(int8, toks[:n]), ref[:n])
        assert rel <= LOGIT_TOL and agree >= ARGMAX_MIN, (n, rel, agree)
    # Free-running greedy: report agreement with HF (a random model's logit margins are small, so
    # one flipped token changes the rest; the first tokens must still agree).
    prompts = [_tokens(L, 700, seed=L) for L in (3, 9, 17)]
    expected = hf_greedy(model_dir, prompts, 8)
    outs = int8.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    matched = [next((i for i, (a, b) in enumerate(zip(o.token_ids, e)) if a != b), 8) for o, e in zip(outs, expected)]
    print(
        f"{variant}: int8/fp32 weight bytes {ratio:.3f}; greedy tokens matching HF before the first "
        f"difference: {matched} of 8"
    )
    assert sum(m >= 1 for m in matched) >= 2


def test_int8_bf16_activations(model_factory):
    model_dir = model_factory("llama_gqa")
    int8 = LLM(model=model_dir, dtype="bfloat16", quantization="int8", kernel_backend="torch")
    proj = int8.engine.runner.model.layers[0].self_attn.qkv_proj
    assert proj.weight is None and proj.qweight.dtype == torch.int8 and proj.wscale.dtype == torch.float32
    toks = _tokens(40, 700, seed=3)
    rel, agree = _close(prefill_logits(int8, toks), hf_logits(model_dir, toks))
    assert rel <= LOGIT_TOL and agree >= ARGMAX_MIN, (rel, agree)


def test_lora_on_int8_base_matches_peft_delta(model_factory, tmp_path):
    """The adapter's effect on an int8 base equals PEFT's effect on the fp32 base: LoRA runs in the
    activation dtype on top of the int8 matmul, it is not quantized and not dropped."""
    model_dir = model_factory("llama_gqa")
    adapter = make_peft_adapter(
        model_dir,
        tmp_path / "a",
        seed=3,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
    )
    int8 = LLM(model=model_dir, dtype="float32", quantization="int8", kernel_backend="torch", max_lora_rank=8)
    int8.add_adapter("a", adapter)
    toks = _tokens(24, 700, seed=5)
    oracle = PeftOracle(model_dir, {"a": adapter})
    with torch.inference_mode():
        oracle.model.set_adapter("a")
        peft_lora = oracle.model(torch.tensor([toks])).logits[0].float()
        with oracle.model.disable_adapter():
            peft_base = oracle.model(torch.tensor([toks])).logits[0].float()
    ours_lora = prefill_logits(int8, toks, adapter="a")
    ours_base = prefill_logits(int8, toks)
    assert int8.engine.runner.model.layers[0].self_attn.qkv_proj.lora_a.dtype == torch.float32
    delta_ref = peft_lora - peft_base
    assert delta_ref.abs().max() > 0.1, "the adapter must visibly change the logits"
    rel, agree = _close(ours_lora, peft_lora)
    assert rel <= LOGIT_TOL and agree >= ARGMAX_MIN, (rel, agree)
    delta_err = ((ours_lora - ours_base) - delta_ref).abs().max() / delta_ref.abs().max()
    assert delta_err.item() <= 0.1


def test_int8_through_triton_kernels_matches_torch_path(model_factory):
    pytest.importorskip("triton")  # on CPU, tests/conftest.py sets TRITON_INTERPRET=1
    model_dir = model_factory("qwen2_bias")  # q/k/v biases go through the kernel's bias path
    toks = _tokens(12, 700, seed=9)
    torch_path = LLM(model=model_dir, dtype="float32", quantization="int8", kernel_backend="torch")
    triton_path = LLM(model=model_dir, dtype="float32", quantization="int8", kernel_backend="triton")
    a, b = prefill_logits(torch_path, toks), prefill_logits(triton_path, toks)
    ref = hf_logits(model_dir, toks)
    # The torch path runs these 12 rows through bf16 activations, Triton in fp32: both near fp32.
    assert _close(b, ref)[0] <= LOGIT_TOL and _close(a, b)[0] <= LOGIT_TOL


def test_quantization_config_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(model=tiny_llama, quantization="int2")
