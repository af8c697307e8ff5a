"""GPTQ and AWQ 4-bit checkpoints (``engine/models/quantized_checkpoint.py``): the engine serving one
computes what the plain HF model holding the float64 dequantization of the checkpoint's codes
computes. The checkpoints are packed by ``gptq_awq_testlib`` from the published layouts, not by our
code, so a misread nibble order, a dropped or doubled GPTQ v1 zero offset, a transposed or
misgrouped scale, or a slice fused in the wrong place is off by far more than the tolerance (the
float model, the control, differs by the quantization error itself). Bad checkpoints get a clear
error naming what is wrong."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from gptq_awq_testlib import act_order_g_idx, write_quantized_checkpoint
from hf_oracle import hf_greedy
from quant_testlib import hf_logits, prefill_logits
from safetensors.torch import load_file, save_file

from loraplex.engine import LLM, SamplingParams

TOL = 1e-3  # relative max logit error: summation order only (the int4 engine tests' bound)


def _tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, vocab) for _ in range(n)]


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def _oracle_dir(model: torch.nn.Module, path: Path) -> str:
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize(
    "fmt, variant, group, backend",
    [
        # The inner loop: each format once on the native kernels; the rest in the whole suite.
        ("gptq", "llama_gqa", 32, "cpu"),
        ("gptq_v2", "qwen2_bias", -1, "cpu"),  # one group per row; q/k/v biases next to the codes
        ("awq", "llama_gqa", 32, "cpu"),
        *(
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [
                ("gptq", "llama_gqa", 32, "torch"),
                ("gptq_v2", "llama_gqa", 64, "cpu"),
                ("gptq", "llama3_rope_tied", 128, "cpu"),  # group larger than K=64: one partial group
                ("awq", "llama_gqa", 32, "torch"),
                ("awq", "qwen2_bias", 64, "cpu"),
            ]
        ),
    ],
)
def test_checkpoint_serves_its_dequantized_model(model_factory, tmp_path, fmt, variant, group, backend):
    base = model_factory(variant)
    ckpt, oracle = write_quantized_checkpoint(base, tmp_path / "q", fmt, group, seed=3)
    ref_dir = _oracle_dir(oracle, tmp_path / "oracle")
    llm = LLM(model=ckpt, dtype="float32", kernel_backend=backend)
    proj = llm.engine.runner.model.layers[0].self_attn.qkv_proj
    assert proj.weight is None and proj.int4_weight() is not None, "the codes must be served as int4"
    toks = _tokens(40, 700)
    ref = hf_logits(ref_dir, toks)
    ours = prefill_logits(llm, toks)  # 40 rows: the dequantize + dense GEMM path
    control = _rel(hf_logits(base, toks), ref)
    rel = _rel(ours, ref)
    assert rel <= TOL < control, (rel, control)
    # Greedy decoding: one row per step, the direct int4 kernel on the cpu backend.
    prompts = [_tokens(n, 700, seed=s) for s, n in enumerate((3, 9, 17))]
    # min_tokens: hf_greedy's min_new_tokens masks EOS, so ours must too (ignore_eos would sample it)
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, min_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy(ref_dir, prompts, 8)


def test_gptq_v1_zero_offset_is_applied_once(model_factory, tmp_path):
    """The same bytes read as v1 (stored zero + 1) and as v2 (stored zero) are different models, and
    only the v1 reading is the checkpoint's: the offset is neither dropped nor applied twice."""
    base = model_factory("llama_gqa")
    ckpt, oracle = write_quantized_checkpoint(base, tmp_path / "q", "gptq", 32, seed=5)
    toks = _tokens(24, 700, seed=1)
    ref = hf_logits(_oracle_dir(oracle, tmp_path / "oracle"), toks)
    assert _rel(prefill_logits(LLM(model=ckpt, dtype="float32"), toks), ref) <= TOL
    cfg_path = Path(ckpt) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["quantization_config"]["checkpoint_format"]  # AutoGPTQ wrote none: v1 by default
    cfg_path.write_text(json.dumps(cfg))
    assert _rel(prefill_logits(LLM(model=ckpt, dtype="float32"), toks), ref) <= TOL
    cfg["quantization_config"]["checkpoint_format"] = "gptq_v2"
    cfg_path.write_text(json.dumps(cfg))
    assert _rel(prefill_logits(LLM(model=ckpt, dtype="float32"), toks), ref) > 10 * TOL


def test_desc_act_with_static_groups_loads(model_factory, tmp_path):
    """desc_act with static groups keeps g_idx = k // group in the stored column order: an ordinary
    grouped checkpoint, served (act-order with a permuted g_idx is refused below)."""
    base = model_factory("llama_gqa")
    ckpt, oracle = write_quantized_checkpoint(base, tmp_path / "q", "gptq", 32, desc_act=True, seed=9)
    toks = _tokens(24, 700, seed=2)
    ref = hf_logits(_oracle_dir(oracle, tmp_path / "oracle"), toks)
    assert _rel(prefill_logits(LLM(model=ckpt, dtype="float32", kernel_backend="cpu"), toks), ref) <= TOL


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_act_order_checkpoint_serves_its_dequantized_model(model_factory, tmp_path, backend):
    """desc_act with a permuted g_idx: the groups are runs of the permuted input order, so the
    engine stores the codes in that order and permutes each projection's input to match (the
    projections that read one input, q/k/v and gate/up, share it as GPTQ computes them)."""
    base = model_factory("llama_gqa")
    ckpt, oracle = write_quantized_checkpoint(base, tmp_path / "q", "gptq", 32, desc_act=True, act_order="shared")
    ref_dir = _oracle_dir(oracle, tmp_path / "oracle")
    llm = LLM(model=ckpt, dtype="float32", kernel_backend=backend)
    assert llm.engine.runner.model.layers[0].mlp.down_proj.q4_perm is not None
    toks = _tokens(40, 700, seed=3)
    ref = hf_logits(ref_dir, toks)
    rel = _rel(prefill_logits(llm, toks), ref)
    assert rel <= TOL < _rel(hf_logits(base, toks), ref), rel
    prompts = [_tokens(n, 700, seed=s) for s, n in enumerate((4, 11))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, min_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy(ref_dir, prompts, 8)


def test_act_order_with_different_orders_in_one_fused_projection_is_refused(model_factory, tmp_path):
    base = model_factory("llama_gqa")
    ckpt, _ = write_quantized_checkpoint(base, tmp_path / "q", "gptq", 32, desc_act=True, act_order="per_module")
    with pytest.raises(ValueError, match=r"q_proj.*k_proj.*different input orders"):
        LLM(model=ckpt, dtype="float32")


def _edit_config(ckpt: str, **changes) -> None:
    path = Path(ckpt) / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg["quantization_config"].pop(key, None)
        else:
            cfg["quantization_config"][key] = value
    path.write_text(json.dumps(cfg))


def _edit_tensor(ckpt: str, name: str, change) -> None:
    path = Path(ckpt) / "model.safetensors"
    tensors = load_file(str(path))
    new = change(tensors.pop(name))
    if new is not None:
        tensors[name] = new.contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


Q = "model.layers.1.self_attn.q_proj"
DOWN = "model.layers.0.mlp.down_proj"
BAD = {
    # name: (format, corruption, message the error must carry)
    "gptq_8bit": ("gptq", lambda c: _edit_config(c, bits=8), r"bits=8.*4-bit"),
    "awq_3bit": ("awq", lambda c: _edit_config(c, bits=3), r"bits=3.*4-bit"),
    "group_16": ("gptq", lambda c: _edit_config(c, group_size=16), r"group_size.*multiple of 32"),
    "awq_gemv": ("awq", lambda c: _edit_config(c, version="gemv"), r"gemv"),
    "awq_no_zero_point": ("awq", lambda c: _edit_config(c, zero_point=False), r"zero_point"),
    "unknown_method": ("gptq", lambda c: _edit_config(c, quant_method="exl2"), r"exl2.*not supported"),
    "gptq_marlin_format": ("gptq", lambda c: _edit_config(c, checkpoint_format="marlin"), r"marlin"),
    "config_group_differs": ("gptq", lambda c: _edit_config(c, group_size=64), r"q_proj.*group"),
    "desc_act_without_g_idx": (
        "gptq",
        lambda c: (_edit_config(c, desc_act=True), _edit_tensor(c, "model.layers.0.mlp.up_proj.g_idx", lambda t: None)),
        r"up_proj: desc_act checkpoint without g_idx",
    ),
    "gptq_missing_qzeros": ("gptq", lambda c: _edit_tensor(c, f"{Q}.qzeros", lambda t: None), r"qzeros"),
    "gptq_scales_groups": ("gptq", lambda c: _edit_tensor(c, f"{DOWN}.scales", lambda t: t[:2]), rf"{DOWN}.*scales"),
    "gptq_scales_outputs": ("gptq", lambda c: _edit_tensor(c, f"{Q}.scales", lambda t: t[:, :56]), rf"{Q}.*scales"),
    "gptq_qzeros_outputs": ("gptq", lambda c: _edit_tensor(c, f"{Q}.qzeros", lambda t: t[:, :7]), rf"{Q}.*qzeros"),
    "gptq_qweight_inputs": ("gptq", lambda c: _edit_tensor(c, f"{DOWN}.qweight", lambda t: t[:8]), rf"{DOWN}"),
    "gptq_g_idx_uneven_groups": (
        "gptq",
        lambda c: _edit_tensor(c, f"{Q}.g_idx", lambda t: torch.cat([t[:1] * 0 + 1, t[1:]])),
        rf"{Q}: g_idx does not cut the inputs into groups of 32",
    ),
    "gptq_g_idx_length": ("gptq", lambda c: _edit_tensor(c, f"{Q}.g_idx", lambda t: t[:32]), rf"{Q}.*g_idx"),
    "awq_scales_outputs": ("awq", lambda c: _edit_tensor(c, f"{Q}.scales", lambda t: t[:, :56]), rf"{Q}.*scales"),
    "awq_qzeros_groups": ("awq", lambda c: _edit_tensor(c, f"{DOWN}.qzeros", lambda t: t[:3]), rf"{DOWN}.*qzeros"),
    "awq_qweight_inputs": ("awq", lambda c: _edit_tensor(c, f"{DOWN}.qweight", lambda t: t[:64]), rf"{DOWN}"),
    "awq_float_qweight": ("awq", lambda c: _edit_tensor(c, f"{Q}.qweight", lambda t: t.float()), rf"{Q}.*int32"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoints_get_a_clear_error(model_factory, tmp_path, case):
    fmt, corrupt, message = BAD[case]
    ckpt, _ = write_quantized_checkpoint(model_factory("llama_gqa"), tmp_path / "q", fmt, 32)
    corrupt(ckpt)
    with pytest.raises(ValueError, match=message):
        LLM(model=ckpt, dtype="float32")


def test_quantized_checkpoint_refuses_int8_on_top(model_factory, tmp_path):
    ckpt, _ = write_quantized_checkpoint(model_factory("llama_gqa"), tmp_path / "q", "awq", 32)
    with pytest.raises(ValueError, match="AWQ 4-bit checkpoint"):
        LLM(model=ckpt, dtype="float32", quantization="int8")


def test_awq_pack_order_is_not_the_identity(model_factory, tmp_path):
    """Guards the oracle itself: the AWQ words really are interleaved (reading them in plain order,
    as a GPTQ-style reader would, gives other codes), so the AWQ cases above test the order."""
    from gptq_awq_testlib import AWQ_PACK_ORDER, _pack_columns

    values = torch.arange(16, dtype=torch.int64).view(2, 8) % 16
    word = _pack_columns(values, AWQ_PACK_ORDER)[0, 0].item() & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert act_order_g_idx(64, 32, 0).tolist() != (torch.arange(64) // 32).tolist()
