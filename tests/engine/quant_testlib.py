"""Helpers for the INT8 tests: full-sequence logits of our model (one prefill forward)."""

from __future__ import annotations

import torch

from loraplex.engine import LLM
from loraplex.engine.models.forward_batch import ForwardBatch
from loraplex.kernels import make_lora_segments


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
