"""Llama-family decoder (Llama, Mistral, Qwen2), written to run one flattened continuous batch.

Every forward takes ALL tokens of a step in one [T, hidden] tensor — decode tokens of many sequences
and prefill chunks of others — and reads/writes the paged KV cache through the kernel ops.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.kernels import KernelOps, packed_replaces_weight
from loraplex.kernels.ops import Linear

from .config import ModelConfig
from .forward_batch import ForwardBatch
from .layers import Projection, RMSNorm, RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = Projection(cfg.hidden_size, [cfg.q_size, cfg.kv_size, cfg.kv_size], bias=cfg.attention_bias)
        self.o_proj = Projection(cfg.q_size, [cfg.hidden_size], bias=False)
        self.rotary = rotary

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch, kv_cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x, batch)
        q_size, kv_size, _ = self.qkv_proj.slice_sizes
        # Rotate q and k heads in one pass: they are adjacent columns of the fused projection.
        cos, sin = self.rotary.tables(positions, qkv.dtype, batch.memo)
        qk = batch.ops.rotary(
            qkv[:, : q_size + kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin
        )
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, q_size + kv_size :].view(T, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        ops = batch.ops
        ops.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        nd = batch.num_decode_tokens
        parts = []
        if nd:
            parts.append(
                ops.paged_decode_attention(
                    q[:nd], k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens, self.scale
                )
            )
        if T > nd:
            parts.append(
                ops.paged_prefill_attention(
                    q[nd:],
                    k_cache,
                    v_cache,
                    batch.prefill_block_tables,
                    batch.prefill_query_start_loc,
                    batch.prefill_context_lens,
                    self.scale,
                )
            )
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        y: torch.Tensor = self.o_proj(out.reshape(T, self.num_heads * self.head_dim), batch)
        return y


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = Projection(cfg.hidden_size, [cfg.intermediate_size, cfg.intermediate_size], bias=False)
        self.down_proj = Projection(cfg.intermediate_size, [cfg.hidden_size], bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(batch.ops.silu_mul(self.gate_up_proj(x, batch)), batch)
        return y


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch, kv_cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x, batch.ops), positions, batch, kv_cache)
        y: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x, batch.ops), batch)
        return y


def _nbytes(t: torch.Tensor) -> int:
    # An opaque oneDNN tensor has no torch storage to ask.
    return int(torch.ops.mkldnn._nbytes(t)) if t.is_mkldnn else t.numel() * t.element_size()


class LMHead(nn.Module):
    """The output projection's weight ([vocab, hidden], name ``lm_head.weight``), uninitialised."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.config = cfg
        # Weights come from the checkpoint: skip nn's random init, whose first call imports
        # torch._dynamo (seconds of start-up) just to fill tensors that are overwritten.
        # nn.Embedding; INT8 quantization swaps in an Int8Embedding (which has no ``weight``).
        self.embed_tokens: nn.Module = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else LMHead(cfg.hidden_size, cfg.vocab_size)
        self.quantized_head: nn.Module | None = None  # INT8: replaces the (tied) output projection
        # ``pack_weights``: the kernels' copy of the output projection and the op that reads it.
        self.packed_head: torch.Tensor | None = None
        self.head_linear: Linear | None = None

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Returns the final hidden states [T, hidden]; call ``compute_logits`` on the rows to sample.
        Runs the first ``len(kv_caches)`` layers: a self-speculation draft (the target's own first
        layers, then its norm and head) is a runner with fewer KV caches over the same module."""
        assert len(kv_caches) <= len(self.layers), "more KV caches than layers"
        x = self.embed_tokens(batch.input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer(x, batch.positions, batch, kv)
        y: torch.Tensor = self.norm(x, batch.ops)
        return y

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.quantized_head is not None:
            logits: torch.Tensor = self.quantized_head(hidden).float()
            return logits
        if self.head_linear is not None:
            # The backend's linear even without a packed copy (a CPU where nothing is packed): in
            # batch_invariant mode it is the one that cuts rows into fixed tiles, and plain F.linear
            # summed a row's logits differently by the batch's size.
            return self.head_linear(hidden, self.output_weight(), None, self.packed_head).float()
        return F.linear(hidden, self.output_weight()).float()

    def pack_weights(self, ops: KernelOps) -> int:
        """Give every float projection and the output head the kernel backend's own copy of its
        weight (``ops.pack_linear_weight``; the native CPU kernels keep oneDNN's blocked layout of
        a bf16 weight, which replaces the plain one, or bf16 panels of a bf16-exact float32 weight
        read at decode batch sizes). Returns the bytes added."""
        added = 0
        for projs in self.lora_projections().values():
            for proj in projs:
                if proj.weight is not None:
                    packed = ops.pack_linear_weight(proj.weight)
                    added += proj.set_packed(packed, packed_replaces_weight(packed))
        if self.quantized_head is None:
            self.packed_head = ops.pack_linear_weight(self.output_weight())
            self.head_linear = ops.linear
            if self.packed_head is not None:
                # The head stays beside its weight: tied, that weight is the embedding table.
                added += _nbytes(self.packed_head)
        return added

    def output_weight(self) -> torch.Tensor:
        """The float output projection: ``lm_head``'s, or the embedding's when tied."""
        if self.lm_head is not None:
            return self.lm_head.weight
        assert isinstance(self.embed_tokens, nn.Embedding), "tied output weight needs the float embedding"
        return self.embed_tokens.weight

    def decoder_layers(self) -> list[DecoderLayer]:
        """``layers`` typed (an ``nn.ModuleList`` iterates as plain Modules)."""
        return cast("list[DecoderLayer]", list(self.layers))

    def lora_projections(self) -> dict[str, list[Projection]]:
        """Projections LoRA can target, keyed by our fused module name, one entry per layer."""
        return {
            "qkv_proj": [l.self_attn.qkv_proj for l in self.decoder_layers()],
            "o_proj": [l.self_attn.o_proj for l in self.decoder_layers()],
            "gate_up_proj": [l.mlp.gate_up_proj for l in self.decoder_layers()],
            "down_proj": [l.mlp.down_proj for l in self.decoder_layers()],
        }
