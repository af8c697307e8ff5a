"""Turns a scheduler step into tensors, runs the model once, returns logits of the sampling rows."""

from __future__ import annotations

import torch

from loraplex.kernels import get_kernel_ops, make_lora_segments

from .config import EngineConfig
from .kv_cache import KVCacheManager
from .models import ModelConfig, load_model
from .models.forward_batch import ForwardBatch
from .models.quantization import quantize_model_int8
from .scheduler import ScheduledChunk, SchedulerOutput
from .sequence import Sequence

_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def default_num_kv_blocks(config: EngineConfig, mcfg: ModelConfig, dtype: torch.dtype, max_model_len: int) -> int:
    per_block = 2 * mcfg.num_layers * config.block_size * mcfg.num_kv_heads * mcfg.head_dim * _BYTES[dtype]
    memory_gb = config.kv_cache_memory_gb
    assert memory_gb is not None, "EngineConfig sizes the KV memory when num_kv_blocks is unset"
    by_memory = int(memory_gb * (1 << 30) // per_block)
    # More than every sequence at full length is never useful.
    assert config.max_num_seqs is not None, "EngineConfig sizes max_num_seqs at construction"
    by_need = config.max_num_seqs * -(-max_model_len // config.block_size) + 1
    return max(2, min(by_memory, by_need))


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int, num_kv_blocks: int):
        self.config = config
        self.model_config = model_config
        self.device = config.torch_device
        self.dtype = config.torch_dtype(model_config.checkpoint_dtype)
        self.ops = get_kernel_ops(config.kernel_backend, self.device)
        if config.quantization == "int8":
            # Loaded in float32 so the int8 codes come from the checkpoint's own precision.
            self.model = load_model(config.model, torch.float32, self.device, max_positions=max_model_len)
            quantize_model_int8(self.model, self.dtype, self.ops.int8_linear)
        else:
            self.model = load_model(config.model, self.dtype, self.device, max_positions=max_model_len)
        shape = (num_kv_blocks, config.block_size, model_config.num_kv_heads, model_config.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(model_config.num_layers)
        ]

    @torch.inference_mode()
    def execute(
        self,
        out: SchedulerOutput,
        kv: KVCacheManager,
        adapter_slots: dict[str, int] | None = None,
        logit_rows: dict[int, int] | None = None,
    ) -> tuple[list[Sequence], torch.Tensor | None]:
        """Run one step. Returns the sequences that sample a token this step and their logits
        (float32 [num_sampling, vocab]), in the same order. ``logit_rows`` (speculative decoding:
        seq_id -> r) asks for the logits of a sampling chunk's last r rows; that sequence then
        appears r times in a row in the returned list, once per logits row."""
        adapter_slots = adapter_slots or {}
        logit_rows = logit_rows or {}
        if out.block_copies:
            self._copy_blocks(out.block_copies)

        def slot_of(chunk: ScheduledChunk) -> int:
            a = chunk.seq.adapter
            return -1 if a is None else adapter_slots[a]

        # One-token chunks (decodes, and 1-token prefill tails) use the decode kernel; the rest use
        # prefill. Within each half, group by adapter slot so LoRA segments are long.
        decodes = sorted((c for c in out.chunks if c.num_tokens == 1), key=slot_of)
        prefills = sorted((c for c in out.chunks if c.num_tokens > 1), key=slot_of)
        ordered = decodes + prefills

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        token_lora: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        for chunk in ordered:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            end = start + chunk.num_tokens
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(kv.slots(seq, start, end))
            token_lora.extend([slot_of(chunk)] * chunk.num_tokens)
            if chunk.samples:
                r = logit_rows.get(seq.seq_id, 1)
                sample_rows.extend(range(len(input_ids) - r, len(input_ids)))
                sample_seqs.extend([seq] * r)

        dev = self.device
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(decodes),
            decode_block_tables=self._block_tables([c.seq for c in decodes], kv),
            decode_context_lens=torch.tensor(
                [c.seq.num_computed_tokens + 1 for c in decodes], dtype=torch.int32, device=dev
            ),
            prefill_block_tables=self._block_tables([c.seq for c in prefills], kv),
            prefill_query_start_loc=torch.tensor(
                _cumsum([c.num_tokens for c in prefills]), dtype=torch.int32, device=dev
            ),
            prefill_context_lens=torch.tensor(
                [c.seq.num_computed_tokens + c.num_tokens for c in prefills], dtype=torch.int32, device=dev
            ),
            ops=self.ops,
            lora_segments=make_lora_segments(token_lora, dev) if any(s >= 0 for s in token_lora) else None,
        )
        hidden = self.model(batch, self.kv_caches)
        if not sample_rows:
            return [], None
        rows = torch.tensor(sample_rows, dtype=torch.long, device=dev)
        return sample_seqs, self.model.compute_logits(hidden.index_select(0, rows))

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: a block shared by forked sequences is copied before one of them writes."""
        last = {d: s for s, d in copies}  # a block freed and reused as a copy target within one step: last wins
        src = torch.tensor(list(last.values()), dtype=torch.long, device=self.device)
        dst = torch.tensor(list(last.keys()), dtype=torch.long, device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
            v_cache.index_copy_(0, dst, v_cache.index_select(0, src))

    def _block_tables(self, seqs: list[Sequence], kv: KVCacheManager) -> torch.Tensor:
        tables = [kv.block_table(s) for s in seqs]
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).reshape(len(seqs), width)


def _cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out
