"""Building blocks of the Llama family: RMSNorm, rotary embeddings, projections with LoRA slots."""

from __future__ import annotations

import math

import torch
from torch import nn

from loraplex.kernels import Int4Weight, KernelOps, reference

from .forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: KernelOps | None = None) -> torch.Tensor:
        # Normalise in float32 like the reference implementation, then cast back; the kernel
        # backend's version where given (the native CPU one is a single pass for bf16 rows).
        norm = reference.rms_norm if ops is None else ops.rms_norm
        return norm(x, self.weight, self.eps)


def rope_inv_freq(head_dim: int, rope: dict) -> torch.Tensor:
    """Inverse frequencies for the rope types Llama-family checkpoints use."""
    theta = float(rope.get("rope_theta", 10000.0))
    # Explicitly on CPU, even when the model is being built under a meta-device context: math on
    # meta tensors goes through torch's Python decompositions, whose first use imports torch._dynamo.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(rope["factor"])
    if kind == "llama3":
        # Llama 3.1 "frequency-dependent" scaling: long wavelengths are slowed by `factor`, short ones
        # kept, and the band in between interpolated smoothly.
        factor = float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_len = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_type {kind!r} is not supported (supported: default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Non-interleaved ("rotate half") rotary embedding: the precomputed cos/sin tables, looked up
    per step (``tables``); the rotation itself is the kernel op ``KernelOps.rotary``."""

    def __init__(self, head_dim: int, max_positions: int, rope: dict):
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, rope)
        t = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, inv_freq)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype, memo: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows [T, 1, D/2] of ``positions`` in ``dtype``. Every layer of a step needs the
        same rows: pass the step's ``memo`` dict to look them up once per step, not once per layer."""
        key = ("rope", id(self), dtype)
        if memo is not None and key in memo:
            cached: tuple[torch.Tensor, torch.Tensor] = memo[key]
            return cached
        tables = (self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype))
        if memo is not None:
            memo[key] = tables
        return tables


class Projection(nn.Module):
    """A linear layer whose output may be several fused slices (q|k|v, gate|up), with room for
    ``max_loras`` stacked LoRA adapters that the LoRA manager writes into by slot.

    Each token of the batch applies the adapter of its own slot (``batch.lora_segments``), through
    the SGMV ops; slots whose rank is 0 here (adapter does not target this module) cost nothing.
    """

    def __init__(self, in_features: int, slice_sizes: list[int], bias: bool):
        super().__init__()
        self.in_features = in_features
        self.slice_sizes = tuple(slice_sizes)
        offsets = [0]
        for s in slice_sizes:
            offsets.append(offsets[-1] + s)
        self.slice_offsets = tuple(offsets)
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(offsets[-1], in_features))
        self.bias = nn.Parameter(torch.zeros(offsets[-1])) if bias else None
        # LoRA slots; allocated by allocate_lora_slots when the engine serves adapters.
        self.lora_a: torch.Tensor | None = None  # [num_slices, max_loras, max_rank, in] (lora storage dtype)
        self.lora_b: torch.Tensor | None = None  # [max_loras, max_rank, out]
        self.lora_ranks: torch.Tensor | None = None  # int32 [max_loras], 0 = not targeted
        self.lora_scales: torch.Tensor | None = None  # float32 [max_loras]
        # INT8 weight-only (``quantization.quantize_model_int8``): ``weight`` is then None and the
        # base matmul reads int8 ``qweight`` [out, in] with float32 per-output-channel ``wscale``.
        self.qweight: torch.Tensor | None
        self.wscale: torch.Tensor | None
        self.register_buffer("qweight", None)
        self.register_buffer("wscale", None)
        # W8A8 (``quantization.quantize_model_w8a8``): the same int8 ``qweight``/``wscale``, and the
        # activations quantized per row at each call (``KernelOps.w8a8_linear``) instead of staying float.
        self.quantize_activations = False
        # INT4 weight-only (``quantization_int4``: quantized at load, or a GPTQ/AWQ checkpoint's codes):
        # ``weight`` is None and the base matmul reads ``int4.Int4Weight``'s packed codes [out, in/2]
        # with float32 per-group scales and offsets [out, groups].
        self.q4_codes: torch.Tensor | None
        self.q4_scales: torch.Tensor | None
        self.q4_offsets: torch.Tensor | None
        self.register_buffer("q4_codes", None)
        self.register_buffer("q4_scales", None)
        self.register_buffer("q4_offsets", None)
        # An act-order GPTQ checkpoint's input permutation: the codes' column j is input column
        # q4_perm[j] (groups are contiguous only in that order); None: the inputs' own order.
        self.q4_perm: torch.Tensor | None
        self.register_buffer("q4_perm", None)
        self.act_dtype: torch.dtype | None = None
        # The kernel backend's own copy of ``weight`` (``KernelOps.pack_linear_weight``: on the
        # native CPU kernels, oneDNN's blocked copy of a bf16 weight, which then replaces ``weight``
        # (None, ``act_dtype`` set), or bf16 panels of a bf16-exact float32 weight beside it).
        self.packed: torch.Tensor | None = None

    @property
    def compute_dtype(self) -> torch.dtype:
        """The activation dtype (LoRA weights live in it, on top of int8/int4 base weights too)."""
        if self.weight is not None:
            return self.weight.dtype
        assert self.act_dtype is not None, "quantized Projection without act_dtype"
        return self.act_dtype

    @property
    def device(self) -> torch.device:
        w = self.weight if self.weight is not None else self.qweight
        w = w if w is not None else self.q4_codes
        w = w if w is not None else self.packed
        assert w is not None, "Projection has neither a float, an int8, an int4 nor a packed weight"
        return w.device

    def set_int4(self, weight: Int4Weight, act_dtype: torch.dtype, input_perm: torch.Tensor | None = None) -> None:
        """Serve this projection from 4-bit codes (the float weight is dropped); ``input_perm``: the
        order of the input columns the codes are stored in (act-order GPTQ), None for their own."""
        out, kp = weight.codes.shape[0], weight.codes.shape[1] * 2
        if out != self.slice_offsets[-1] or kp < self.in_features:
            raise ValueError(
                f"int4 weight [{out}, {kp}] does not fit projection [{self.slice_offsets[-1]}, {self.in_features}]"
            )
        self.weight = None
        if input_perm is not None and tuple(input_perm.shape) != (self.in_features,):
            raise ValueError(f"int4 input permutation of {tuple(input_perm.shape)} for {self.in_features} inputs")
        self.q4_codes, self.q4_scales, self.q4_offsets = weight
        self.q4_perm = None if input_perm is None else input_perm.to(torch.int64)
        self.act_dtype = act_dtype

    def int4_weight(self) -> Int4Weight | None:
        if self.q4_codes is None:
            return None
        assert self.q4_scales is not None and self.q4_offsets is not None
        return Int4Weight(self.q4_codes, self.q4_scales, self.q4_offsets)

    def set_packed(self, packed: torch.Tensor | None, replaces_weight: bool) -> int:
        """Keep the backend's packed copy; drop the plain weight when the copy replaces it.
        Returns the bytes this adds (0 when it replaces a weight of the same size)."""
        assert self.weight is not None
        self.packed = packed
        if packed is None:
            return 0
        if replaces_weight:
            self.act_dtype = self.weight.dtype
            self.weight = None
            return 0
        return packed.numel() * packed.element_size()

    def allocate_lora_slots(self, max_loras: int, max_rank: int, dtype: torch.dtype | None = None) -> None:
        """``dtype``: the adapters' storage dtype (``EngineConfig.lora_dtype``; default the
        activation dtype); the SGMV ops compute in fp32 whatever it is."""
        dtype, dev = dtype or self.compute_dtype, self.device
        self.lora_a = torch.zeros(len(self.slice_sizes), max_loras, max_rank, self.in_features, dtype=dtype, device=dev)
        self.lora_b = torch.zeros(max_loras, max_rank, self.slice_offsets[-1], dtype=dtype, device=dev)
        self.lora_ranks = torch.zeros(max_loras, dtype=torch.int32, device=dev)
        self.lora_scales = torch.zeros(max_loras, dtype=torch.float32, device=dev)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q4 = self.int4_weight()
        if q4 is not None:
            xq = x if self.q4_perm is None else x.index_select(-1, self.q4_perm)
            y = batch.ops.int4_linear(xq, q4, self.bias)  # LoRA below reads x in its own order
        elif self.qweight is not None:
            assert self.wscale is not None
            int8_matmul = batch.ops.w8a8_linear if self.quantize_activations else batch.ops.int8_linear
            y = int8_matmul(x, self.qweight, self.wscale, self.bias)
        else:
            y = batch.ops.linear(x, self.weight, self.bias, self.packed)
        seg = batch.lora_segments
        if seg is not None and self.lora_a is not None:
            # allocate_lora_slots sets all four together.
            assert self.lora_b is not None and self.lora_ranks is not None and self.lora_scales is not None
            shrunk = batch.ops.sgmv_shrink(x, self.lora_a, seg, self.lora_ranks)
            y = batch.ops.sgmv_expand(
                y, shrunk, self.lora_b, seg, self.lora_ranks, self.lora_scales, self.slice_offsets
            )
        return y
