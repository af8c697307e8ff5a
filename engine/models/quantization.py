"""INT8 weight-only quantization of a loaded model (``EngineConfig.quantization = "int8"``), and
W8A8 (``"w8a8"``: the same weights, activations quantized per token in the decoder's linears and
the head).

Every linear layer of the decoder (fused q|k|v, o, gate|up, down), the output projection and the
token embedding get per-output-channel symmetric int8 weights with float32 scales, computed once at
load from the checkpoint's full-precision weights. Norms, biases and LoRA stay in the activation
dtype: an adapter's delta is added on top of the int8 base matmul, exactly as on a float model.

Why the embedding and the head too: on small models they are most of the bytes (a 1k-64k vocabulary
next to a few narrow layers), and per-row int8 is lossless enough for both: the embedding reads one
row per token (dequantized on the fly), the head is one more int8 matmul.
"""

from __future__ import annotations

import torch
from torch import nn

from loraplex.kernels import quantize_per_channel_int8
from loraplex.kernels.ops import Int8Linear, W8A8Linear

from .layers import Projection
from .llama import LlamaForCausalLM


class Int8Embedding(nn.Module):
    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.qweight: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.qweight[ids].float() * self.scales[ids, None]).to(self.dtype)


class Int8Head(nn.Module):
    """The output projection (tied or not) as one int8 matmul through the kernel ops."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, int8_linear: Int8Linear):
        super().__init__()
        self.qweight: torch.Tensor
        self.scales: torch.Tensor
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.int8_linear = int8_linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.int8_linear(hidden, self.qweight, self.scales)


@torch.no_grad()
def quantize_model_int8(
    model: LlamaForCausalLM, act_dtype: torch.dtype, int8_linear: Int8Linear, activations: bool = False
) -> None:
    """In place. ``model`` must still hold the checkpoint's weights at full precision (load it in
    float32): quantizing after a cast to bf16 would round every weight twice. ``activations``:
    W8A8 (``quantization="w8a8"``): the decoder's projections also quantize their input per row at
    each call (``KernelOps.w8a8_linear``); ``int8_linear`` is the head's matmul (see
    ``quantize_model_w8a8``)."""
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    codes = []
    for proj in projections:
        assert proj.weight is not None, "model is already quantized"
        codes.append(quantize_per_channel_int8(proj.weight))
        proj.weight = None  # drop the float weight before the cast below (peak memory)
    quantize_head_and_embedding_int8(model, act_dtype, int8_linear)
    for proj, (q, s) in zip(projections, codes):
        proj.qweight, proj.wscale, proj.act_dtype = q, s, act_dtype
        proj.quantize_activations = activations


def quantize_model_w8a8(model: LlamaForCausalLM, act_dtype: torch.dtype, w8a8_linear: W8A8Linear) -> None:
    """W8A8 (``EngineConfig.quantization = "w8a8"``): the INT8 path's per-channel int8 weights
    everywhere, and the decoder's linear layers (fused q|k|v, o, gate|up, down) and the output
    projection also quantize their activations to int8 per token at each call, multiplying int8 by
    int8 into int32 (``w8a8_linear``, which the head is given as its matmul).

    The embedding is a row lookup (no matmul, nothing to quantize): per-row int8 weights as in INT8.
    The head's activations are quantized too, by measurement (benchmarks/engine/quantization_w8a8.py,
    docs/quantization-and-speculation.md): a weight-only int8 head dequantizes the whole 49k x 576
    matrix on every step of more than 16 sequences (kernels/int8.py), which made decode at batch
    64 1.16x slower than with the w8a8 head, for no better perplexity (28.9 vs 28.6 on the
    shipped text; bf16 28.0)."""
    quantize_model_int8(model, act_dtype, w8a8_linear, activations=True)


@torch.no_grad()
def quantize_head_and_embedding_int8(model: LlamaForCausalLM, act_dtype: torch.dtype, int8_linear: Int8Linear) -> None:
    """The output projection and the embedding as per-row int8 (one matrix when tied), then the rest
    of the model (norms, biases, float projections left) cast to ``act_dtype``. Callers attach their
    own quantized buffers after this, so the cast does not touch their float32 scales."""
    head_q, head_s = quantize_per_channel_int8(model.output_weight())
    if model.lm_head is None:  # tied: one int8 matrix serves both, as one float matrix did
        emb_q, emb_s = head_q, head_s
    else:
        assert isinstance(model.embed_tokens, nn.Embedding)
        emb_q, emb_s = quantize_per_channel_int8(model.embed_tokens.weight)
    model.lm_head = None
    model.register_module("embed_tokens", None)  # = None, but typed: the attribute is an nn.Module
    model.to(dtype=act_dtype)  # norms and biases; scales are attached afterwards, in float32
    model.embed_tokens = Int8Embedding(emb_q, emb_s, act_dtype)
    model.quantized_head = Int8Head(head_q, head_s, int8_linear)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights (parameters and persistent buffers, each shared tensor once),
    plus the kernel backend's packed copies (``Projection.packed``, the model's ``packed_head``:
    oneDNN's blocked bf16 weight replaces the plain one, and a bf16-exact float32 model keeps bf16
    panels beside its weights); computed tables (rotary cos/sin) and LoRA slots are not weights."""
    seen: set[int] = set()
    total = 0
    for t in model.state_dict().values():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    for module in model.modules():
        for attr in ("packed", "packed_head"):
            t = getattr(module, attr, None)
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))  # an opaque oneDNN tensor has no data pointer to ask
                total += int(torch.ops.mkldnn._nbytes(t)) if t.is_mkldnn else t.numel() * t.element_size()
    return total
