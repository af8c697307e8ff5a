"""The shape grid every GPU check runs over: realistic models, ranks, dtypes, decode and prefill.

``launches()`` yields (label, thunk); each thunk calls one real launcher from ``loraplex.kernels``
with tensors of those shapes on ``DEVICE`` (CPU for the ahead-of-time compile, where launches
are recorded, not run; CUDA for ``cuda_check.py``). Contents of the tensors are irrelevant to AOT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

QUICK = False
DEVICE = "cpu"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# (name, hidden, heads, kv_heads, head_dim, intermediate)
MODELS = (
    ("llama3-8b", 4096, 32, 8, 128, 14336),
    ("llama3.2-1b", 2048, 32, 8, 64, 8192),
    ("qwen2-7b", 3584, 28, 4, 128, 18944),
    ("llama2-7b-mha", 4096, 32, 32, 128, 11008),
)
RANKS = (8, 16, 32, 64)
DECODE_SEGS = (1, 2, 4, 8)  # tokens per adapter segment in a decode batch (GEMV tiles)
PREFILL_SEGS = (16, 32, 512)  # prefill chunks (dot tiles)
KV_BLOCK = 16


def _models():
    return MODELS[:2] if QUICK else MODELS


def _dtypes():
    return DTYPES[:1] + DTYPES[2:] if QUICK else DTYPES


def _segments(seg_len: int, tokens: int):
    from loraplex.kernels import make_lora_segments

    return make_lora_segments([(i // seg_len) % 4 for i in range(tokens)], DEVICE)


def launches() -> Iterator[tuple[str, Callable[[], object]]]:
    from loraplex.kernels import triton_decode_attention as tda
    from loraplex.kernels import triton_kv_write as tkv
    from loraplex.kernels import triton_prefill_attention as tpa
    from loraplex.kernels import triton_sgmv as ts

    dev = DEVICE
    for dtype in _dtypes():
        dt = str(dtype).removeprefix("torch.")
        for name, hidden, hq, hkv, d, inter in _models():
            q_size, kv_size = hq * d, hkv * d
            # LoRA: fused qkv (3 slices), gate_up (2), o / down (1); decode and prefill segment lengths.
            layers = (
                ("qkv", hidden, (q_size, kv_size, kv_size)),
                ("gate_up", hidden, (inter, inter)),
                ("o", q_size, (hidden,)),
                ("down", inter, (hidden,)),
            )
            for seg in DECODE_SEGS + PREFILL_SEGS:
                tokens = max(64, seg)
                segs = _segments(seg, tokens)
                for rank in RANKS:
                    for lname, fan_in, widths in layers:
                        if QUICK and lname in ("o", "down"):
                            continue
                        offsets = [0]
                        for w in widths:
                            offsets.append(offsets[-1] + w)

                        def shrink(fan_in=fan_in, widths=widths, segs=segs, rank=rank, tokens=tokens):
                            x = torch.empty(tokens, fan_in, dtype=dtype, device=dev)
                            a = torch.empty(len(widths), 4, rank, fan_in, dtype=dtype, device=dev)
                            ranks = torch.full((4,), rank, dtype=torch.int32, device=dev)
                            return ts.sgmv_shrink(x, a, segs, ranks)

                        def expand(widths=widths, offsets=tuple(offsets), segs=segs, rank=rank, tokens=tokens):
                            y = torch.empty(tokens, offsets[-1], dtype=dtype, device=dev)
                            s = torch.empty(len(widths), tokens, rank, dtype=torch.float32, device=dev)
                            b = torch.empty(4, rank, offsets[-1], dtype=dtype, device=dev)
                            ranks = torch.full((4,), rank, dtype=torch.int32, device=dev)
                            scales = torch.ones(4, dtype=torch.float32, device=dev)
                            return ts.sgmv_expand(y, s, b, segs, ranks, scales, offsets)

                        label = f"{dt} {name} {lname} seg={seg} r={rank}"
                        yield f"shrink {label}", shrink
                        yield f"expand {label}", expand
            # Attention: decode batches (few long / many short contexts: split and one-pass kernels),
            # prefill chunks of several lengths, KV writes.
            for num_seqs, ctx in ((1, 4096), (8, 1024), (64, 512), (256, 128)):

                def decode(num_seqs=num_seqs, ctx=ctx, hq=hq, hkv=hkv, d=d):
                    q = torch.empty(num_seqs, hq, d, dtype=dtype, device=dev)
                    kc = torch.empty(4, KV_BLOCK, hkv, d, dtype=dtype, device=dev)
                    bt = torch.zeros(num_seqs, ctx // KV_BLOCK, dtype=torch.int32, device=dev)
                    lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=dev)
                    return tda.paged_decode_attention(q, kc, kc, bt, lens, d**-0.5)

                yield f"decode {dt} {name} seqs={num_seqs} ctx={ctx}", decode
            for qlen in (16, 32, 512):

                def prefill(qlen=qlen, hq=hq, hkv=hkv, d=d):
                    q = torch.empty(qlen, hq, d, dtype=dtype, device=dev)
                    kc = torch.empty(4, KV_BLOCK, hkv, d, dtype=dtype, device=dev)
                    bt = torch.zeros(1, 2048 // KV_BLOCK, dtype=torch.int32, device=dev)
                    qsl = torch.tensor([0, qlen], dtype=torch.int32, device=dev)
                    lens = torch.tensor([qlen + 64], dtype=torch.int32, device=dev)
                    return tpa.paged_prefill_attention(q, kc, kc, bt, qsl, lens, d**-0.5, max_query_len=qlen)

                yield f"prefill {dt} {name} qlen={qlen}", prefill

            def write(hkv=hkv, d=d):
                k = torch.empty(64, hkv, d, dtype=dtype, device=dev)
                kc = torch.empty(8, KV_BLOCK, hkv, d, dtype=dtype, device=dev)
                slots = torch.arange(64, dtype=torch.long, device=dev)
                return tkv.write_kv(kc, kc, k, k, slots)

            yield f"write_kv {dt} {name}", write
