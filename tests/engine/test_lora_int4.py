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
from lora_testlib import PeftOracle, make_adapters, make_prompts
from quant_testlib import int4_dequantized_checkpoint, prefill_logits

from loraplex.engine import LLM, SamplingParams

TOL = 1e-4  # relative max logit error: summation order only (measured ~1e-6 with float32 adapters)
TIE = 0.02  # logits: what the bf16 decode head may reorder (measured gaps of ~5e-4)
ASSIGN = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", "attn_r8", "mlp_r4"]


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


def _oracle_logits(oracle: PeftOracle, tokens: list[int], adapter: str | None) -> torch.Tensor:
    with torch.inference_mode():
        if adapter is None:
            with oracle.model.disable_adapter():
                return oracle.model(torch.tensor([tokens])).logits[0].float()
        oracle.model.set_adapter(adapter)
        return oracle.model(torch.tensor([tokens])).logits[0].float()


def test_mixed_adapter_batch_on_int4_matches_peft(setup):
    """Every token the engine picks is PEFT's greedy choice on the same prefix, up to a near-tie of
    TIE logits: the int8 head of ``quantization="int4"`` runs decode-sized rows through
    ``_weight_int8pack_mm`` in bf16 (kernels/int8.py), a ~1e-3 rounding of the logits that can
    flip a tie. A skipped or misapplied adapter picks tokens far below PEFT's best."""
    llm, _, _, oracle = setup
    assert llm.engine.runner.model.layers[0].mlp.down_proj.int4_weight() is not None
    max_new = 8
    prompts = make_prompts(len(ASSIGN), llm.engine.model_config.vocab_size, seed=2)
    params = SamplingParams(max_tokens=max_new, min_tokens=max_new, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=ASSIGN)
    changed, identical = set(), 0
    for i, (prompt, adapter, out) in enumerate(zip(prompts, ASSIGN, outs)):
        assert len(out.token_ids) == max_new and out.adapter == adapter
        logits = _oracle_logits(oracle, prompt + out.token_ids[:-1], adapter)[len(prompt) - 1 :]
        best = logits.max(dim=-1).values
        picked = logits.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        gap = (best - picked).max().item()
        assert gap <= TIE, f"request {i} (adapter {adapter}): a token {gap:.4f} below PEFT's greedy choice"
        expected = oracle.greedy(prompt, adapter, max_new)
        identical += out.token_ids == expected
        if adapter is not None and expected != oracle.greedy(prompt, None, max_new):
            changed.add(adapter)
    assert identical >= len(ASSIGN) - 2, f"only {identical}/{len(ASSIGN)} requests equal PEFT's greedy output"
    # The adapters must actually matter, or the comparison proves nothing.
    assert len(changed) >= 3, f"only {changed} changed the base model's output"
    assert llm.engine.stats()["lora"]["max_adapters_per_step"] >= 4


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
