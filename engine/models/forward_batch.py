"""Everything one model forward needs besides the weights: the flattened token batch of a step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loraplex.kernels import KernelOps, LoraSegments


@dataclass
class ForwardBatch:
    """One engine step as tensors. Decode tokens come first (one per sequence), then the prefill
    chunks; each half has its own block tables because the two attention ops differ."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T], flat KV slot each token writes to
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # int32 [num_decode, max_blocks]
    decode_context_lens: torch.Tensor  # int32 [num_decode]
    prefill_block_tables: torch.Tensor  # int32 [num_prefill, max_blocks]
    prefill_query_start_loc: torch.Tensor  # int32 [num_prefill + 1], offsets within the prefill half
    prefill_context_lens: torch.Tensor  # int32 [num_prefill]
    ops: KernelOps
    lora_segments: LoraSegments | None = None  # None: no token in this step uses an adapter
    # Values every layer of this step derives identically (rotary cos/sin rows): computed once.
    memo: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
