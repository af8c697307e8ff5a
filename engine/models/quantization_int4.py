"""INT4 weight-only quantization of a loaded model (``EngineConfig.quantization = "int4"``).

Every linear layer of the decoder (fused q|k|v, o, gate|up, down) gets group-wise asymmetric 4-bit
codes (``kernels.int4``: ``quantization_group_size`` columns per scale and zero point), computed
once at load from the checkpoint's full-precision weights. Norms, biases and LoRA stay in the
activation dtype: an adapter's delta is added on top of the int4 base matmul (the SGMV path is the
float model's).

The output projection and the token embedding are NOT 4-bit: they get the INT8 path's per-row int8
(``quantization.quantize_head_and_embedding_int8``). Why: the head's rounding error lands directly on
the logits, unaveraged by any later layer, and 4-bit heads are where greedy agreement drops first
(GPTQ and AWQ leave the head in 16 bits for that reason); per-row int8 is near-lossless there, and on
small models (tied 49k x 576 on SmolLM2-135M: 21% of the parameters) a 16/32-bit head would be the
largest tensor left. A GPTQ/AWQ checkpoint's head stays as the checkpoint stores it
(``quantized_checkpoint``): its author chose.
"""

from __future__ import annotations

import torch

from loraplex.kernels import pack_int4, quantize_int4
from loraplex.kernels.ops import Int8Linear

from .layers import Projection
from .llama import LlamaForCausalLM
from .quantization import quantize_head_and_embedding_int8


@torch.no_grad()
def quantize_model_int4(
    model: LlamaForCausalLM, act_dtype: torch.dtype, group_size: int, int8_linear: Int8Linear
) -> None:
    """In place. ``model`` must still hold the checkpoint's weights at full precision (load it in
    float32): the codes then come from the checkpoint's own numbers, not from a bf16 rounding."""
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    packed = []
    for proj in projections:
        assert proj.weight is not None, "model is already quantized"
        packed.append(pack_int4(*quantize_int4(proj.weight, group_size), group_size))
        proj.weight = None  # drop the float weight before the next one is quantized (peak memory)
    quantize_head_and_embedding_int8(model, act_dtype, int8_linear)
    for proj, weight in zip(projections, packed):
        proj.set_int4(weight, act_dtype)
