"""Helpers for the INT8/INT4 tests: full-sequence logits of our model (one prefill forward), and the
HF checkpoint holding what ``quantization="int4"`` makes of a float one."""

from __future__ import annotations

import torch

from loraplex.engine import LLM
from loraplex.engine.models.forward_batch import ForwardBatch
from loraplex.kernels import dequantize_int4, make_lora_segments, pack_int4, quantize_int4
from loraplex.kernels.int8 import dequantize_int8, quantize_per_channel_int8

DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@torch.inference_mode()
def prefill_logits(llm: LLM, tokens: list[int], adapter: str | None = None) -> torch.Tensor:
    """float32 [len(tokens), vocab]: every position's logits from one prefill through the engine's
    own model, kernels and KV cache (written from block 0 on; call only on an idle engine)."""
    runner = llm.engine.runner
    T, bs = len(tokens), llm.engine.kv.block_size
    dev = runner.device
    nb = -(-T // bs)
    segments = None
    if adapter is not None:
        slot = llm.engine.lora.prepare({adapter})[adapter]
        segments = make_lora_segments([slot] * T, dev)
    batch = ForwardBatch(
        input_ids=torch.tensor(tokens, device=dev),
        positions=torch.arange(T, device=dev),
        slot_mapping=torch.arange(T, device=dev),
        num_decode_tokens=0,
        decode_block_tables=torch.zeros(0, 0, dtype=torch.int32, device=dev),
        decode_context_lens=torch.zeros(0, dtype=torch.int32, device=dev),
        prefill_block_tables=torch.arange(nb, dtype=torch.int32, device=dev)[None],
        prefill_query_start_loc=torch.tensor([0, T], dtype=torch.int32, device=dev),
        prefill_context_lens=torch.tensor([T], dtype=torch.int32, device=dev),
        ops=runner.ops,
        lora_segments=segments,
    )
    hidden = runner.model(batch, runner.kv_caches)
    return runner.model.compute_logits(hidden)


def hf_logits(model_dir: str, tokens: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0].float()


def int4_dequantized_checkpoint(model_dir: str, out_dir, group_size: int) -> str:
    """The HF model with every decoder linear's weight replaced by its int4 round trip and the
    head (and embedding) by its per-row int8 round trip: what the engine's int4 model computes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DECODER_LINEARS:
                w = module.weight
                packed = pack_int4(*quantize_int4(w, group_size), group_size)
                w.copy_(dequantize_int4(packed, w.shape[1]))
        head = model.get_output_embeddings().weight
        head.copy_(dequantize_int8(*quantize_per_channel_int8(head), torch.float32))
        emb = model.get_input_embeddings().weight
        if emb.data_ptr() != head.data_ptr():
            emb.copy_(dequantize_int8(*quantize_per_channel_int8(emb), torch.float32))
    model.save_pretrained(out_dir, safe_serialization=True)
    return str(out_dir)


def int8_round_trip_checkpoint(model_dir: str, out_dir) -> str:
    """The HF model with every decoder linear, the head and the embedding holding their per-row int8
    round trip: the weights of ``quantization="int8"`` and of ``"w8a8"``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        weights = [m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        weights.append(model.get_input_embeddings().weight)
        seen: set[int] = set()
        for w in weights:
            if w.data_ptr() not in seen:  # a tied head and embedding: one matrix
                seen.add(w.data_ptr())
                w.copy_(dequantize_int8(*quantize_per_channel_int8(w), torch.float32))
    model.save_pretrained(out_dir, safe_serialization=True)
    return str(out_dir)


def fake_quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x's per-row symmetric int8 round trip, in float32: scale max|x| / 127 per row (1 for a zero
    row), round half to even, clamp to +-127, times the scale. Written here, not imported from
    ``kernels.w8a8``: the engine tests' oracle must not be the code under test."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return (torch.round(xf / scale).clamp(-127, 127) * scale).to(x.dtype)


def quantize_linear_activations(model: torch.nn.Module) -> int:
    """Make the HF (or PEFT-wrapped) model's decoder linears and its head see their input's per-row
    int8 round trip, as ``quantization="w8a8"`` does; a PEFT adapter's own A still reads the float
    input (its ``base_layer`` gets the hook). Returns how many linears got one."""
    hooked = 0
    for name, module in model.named_modules():
        parts = name.split(".")
        base = parts[-2] if parts[-1] == "base_layer" else parts[-1]
        targets = (*DECODER_LINEARS, "lm_head")
        if isinstance(module, torch.nn.Linear) and base in targets and "lora_" not in name:
            module.register_forward_pre_hook(lambda _m, args: (fake_quantize_rows(args[0]), *args[1:]))
            hooked += 1
    return hooked
