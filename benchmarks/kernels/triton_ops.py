"""Kernel micro-benchmarks: Triton SGMV and paged attention vs the torch reference, on CUDA.

    python -m benchmarks.kernels.triton_ops                 # CUDA: full table + benchmarks/results/kernels.json
    python -m benchmarks.kernels.triton_ops --quick         # CUDA: a few cases of each kind
    python -m benchmarks.kernels.triton_ops --cpu-smoke     # no GPU: tiny shapes through the Triton interpreter

Each row: median time (``triton.testing.do_bench``), achieved GB/s (bytes that must move at least
once: weights/KV actually used, activations in and out) and TFLOP/s, the same op through the torch
reference, and the device's measured copy bandwidth (a large ``copy_``) to read GB/s against.
Shapes are Llama-3-8B-like: hidden 4096, qkv 4096+2x1024, gate_up 2x14336, 32 q / 8 kv heads of 128,
KV block 16. Without CUDA (and without ``--cpu-smoke``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.lib.paths import RESULTS

RESULTS_JSON = RESULTS / "kernels.json"


@dataclass
class Row:
    op: str
    case: str
    triton_ms: float
    gbytes: float
    gflop: float
    torch_ms: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def gb_s(self) -> float:
        return self.gbytes / (self.triton_ms * 1e-3)

    @property
    def tflop_s(self) -> float:
        return self.gflop / (self.triton_ms * 1e-3) / 1e3


class Bench:
    """Everything device-dependent: tensor factory, timer, sizes."""

    def __init__(self, cpu_smoke: bool, quick: bool):
        import torch

        self.torch = torch
        self.smoke = cpu_smoke
        self.quick = quick or cpu_smoke
        self.device = torch.device("cpu" if cpu_smoke else "cuda")
        self.dtype = torch.float16 if cpu_smoke else torch.bfloat16  # interpreter: no bf16 math

    def time_ms(self, fn) -> float:
        if self.smoke:
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100))

    def copy_bandwidth_gb_s(self) -> float:
        torch = self.torch
        n = (1 << 20) if self.smoke else (1 << 30)  # bytes
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src))
        return 2 * n / (ms * 1e-3) / 1e9  # read + write


# ------------------------------------------------------------------------------------------- SGMV
def sgmv_rows(b: Bench) -> list[Row]:
    torch = b.torch
    from loraplex.kernels import make_lora_segments, reference, triton_sgmv

    if b.smoke:
        hidden, layers = 64, {"qkv": [64, 16, 16], "gate_up": [96, 96]}
        decode_tokens, prefill_tokens, ranks_list, num_adapters = [1, 8], [40], [16], 4
    else:
        hidden, layers = 4096, {"qkv": [4096, 1024, 1024], "gate_up": [14336, 14336]}
        decode_tokens = [1, 16, 64, 256] if not b.quick else [1, 64]
        prefill_tokens = [1024, 4096] if not b.quick else [1024]
        ranks_list, num_adapters = [16, 64], 64
    e = torch.tensor([], dtype=b.dtype).element_size()
    rows: list[Row] = []
    for layer, widths in layers.items():
        offsets = [0]
        for w in widths:
            offsets.append(offsets[-1] + w)
        offsets = tuple(offsets)
        for rank in ranks_list:
            a = torch.randn(len(widths), num_adapters, rank, hidden, device=b.device).to(b.dtype) * 0.02
            bw = torch.randn(num_adapters, rank, offsets[-1], device=b.device).to(b.dtype) * 0.02
            ranks = torch.full((num_adapters,), rank, dtype=torch.int32, device=b.device)
            scales = torch.ones(num_adapters, device=b.device)
            shapes = [("decode", t) for t in decode_tokens] + [("prefill", t) for t in prefill_tokens]
            for kind, tokens in shapes:
                if kind == "decode":  # tokens spread over all adapters, sorted by slot like the engine does
                    slots = (
                        [i * num_adapters // tokens for i in range(tokens)]
                        if tokens >= num_adapters
                        else list(range(tokens))
                    )
                else:  # a few long prefill chunks, one adapter each
                    n_seq = 4
                    slots = [min(i * n_seq // tokens, n_seq - 1) for i in range(tokens)]
                seg = make_lora_segments(slots, device=b.device)
                used = len(set(slots))
                x = torch.randn(tokens, hidden, device=b.device).to(b.dtype)
                y = torch.randn(tokens, offsets[-1], device=b.device).to(b.dtype)
                shrunk = torch.empty(len(widths), tokens, rank, dtype=torch.float32, device=b.device)
                case = f"{layer} r{rank} {kind} T={tokens} adapters={used}"
                ms = b.time_ms(lambda: triton_sgmv.sgmv_shrink(x, a, seg, ranks, out=shrunk))
                ref_ms = b.time_ms(lambda: reference.sgmv_shrink(x, a, seg, ranks)) if tokens <= 1024 else None
                rows.append(
                    Row(
                        "sgmv_shrink",
                        case,
                        ms,
                        gbytes=(
                            tokens * hidden * e
                            + used * len(widths) * rank * hidden * e
                            + len(widths) * tokens * rank * 4
                        )
                        / 1e9,
                        gflop=2 * tokens * len(widths) * rank * hidden / 1e9,
                        torch_ms=ref_ms,
                        extra={"split_k": triton_sgmv._shrink_config(seg, len(widths), rank, hidden, b.device)[4]},
                    )
                )
                ms = b.time_ms(lambda: triton_sgmv.sgmv_expand(y, shrunk, bw, seg, ranks, scales, offsets))
                ref_ms = (
                    b.time_ms(lambda: reference.sgmv_expand(y, shrunk, bw, seg, ranks, scales, offsets))
                    if tokens <= 1024
                    else None
                )
                rows.append(
                    Row(
                        "sgmv_expand",
                        case,
                        ms,
                        gbytes=(
                            len(widths) * tokens * rank * 4
                            + used * rank * offsets[-1] * e
                            + 2 * tokens * offsets[-1] * e
                        )
                        / 1e9,
                        gflop=2 * tokens * rank * offsets[-1] / 1e9,
                        torch_ms=ref_ms,
                    )
                )
    return rows


# -------------------------------------------------------------------------------------- attention
def _paged_cache(b: Bench, ctx_lens, block_size, hkv, d):
    torch = b.torch
    blocks_per_seq = [(c + block_size - 1) // block_size for c in ctx_lens]
    total = sum(blocks_per_seq)
    k_cache = torch.randn(total, block_size, hkv, d, device=b.device).to(b.dtype)
    v_cache = torch.randn(total, block_size, hkv, d, device=b.device).to(b.dtype)
    perm = torch.randperm(total, device=b.device).to(torch.int32)  # scattered, like a long-running pool
    table = torch.zeros(len(ctx_lens), max(blocks_per_seq), dtype=torch.int32, device=b.device)
    at = 0
    for s, n in enumerate(blocks_per_seq):
        table[s, :n] = perm[at : at + n]
        at += n
    ctx = torch.tensor(ctx_lens, dtype=torch.int32, device=b.device)
    return k_cache, v_cache, table, ctx


def attention_rows(b: Bench) -> list[Row]:
    torch = b.torch
    from loraplex.kernels import reference, triton_decode_attention, triton_prefill_attention

    if b.smoke:
        hq, hkv, d, block_size = 4, 2, 64, 16
        decode = [(2, 40)]
        prefill = [(1, 24, 0), (2, 16, 20)]
    else:
        hq, hkv, d, block_size = 32, 8, 128, 16
        decode = [(bs, c) for bs in (1, 8, 32, 128) for c in (512, 2048, 8192)]
        prefill = [(1, 512, 0), (1, 2048, 0), (4, 512, 2048), (1, 4096, 4096)]
        if b.quick:
            decode = [(1, 2048), (32, 2048), (128, 8192)]
            prefill = [(1, 2048, 0), (4, 512, 2048)]
    e = torch.tensor([], dtype=b.dtype).element_size()
    scale = d**-0.5
    rows: list[Row] = []
    for batch, ctx_len in decode:
        k_cache, v_cache, table, ctx = _paged_cache(b, [ctx_len] * batch, block_size, hkv, d)
        q = torch.randn(batch, hq, d, device=b.device).to(b.dtype)
        ms = b.time_ms(lambda: triton_decode_attention.paged_decode_attention(q, k_cache, v_cache, table, ctx, scale))
        # The reference materialises every sequence's K/V in fp32: skip it where that is huge.
        ref_ok = batch * ctx_len * hkv * d * 4 * 2 <= (64 << 20 if b.smoke else 4 << 30)
        ref_ms = (
            b.time_ms(lambda: reference.paged_decode_attention(q, k_cache, v_cache, table, ctx, scale))
            if ref_ok
            else None
        )
        kv_tokens = batch * ctx_len
        rows.append(
            Row(
                "paged_decode",
                f"batch={batch} ctx={ctx_len}",
                ms,
                gbytes=(2 * kv_tokens * hkv * d * e + 2 * batch * hq * d * e) / 1e9,
                gflop=4 * kv_tokens * hq * d / 1e9,
                torch_ms=ref_ms,
            )
        )
    for n_seq, q_len, prefix in prefill:
        k_cache, v_cache, table, ctx = _paged_cache(b, [prefix + q_len] * n_seq, block_size, hkv, d)
        q = torch.randn(n_seq * q_len, hq, d, device=b.device).to(b.dtype)
        qsl = torch.arange(0, n_seq * q_len + 1, q_len, dtype=torch.int32, device=b.device)
        ms = b.time_ms(
            lambda: triton_prefill_attention.paged_prefill_attention(
                q, k_cache, v_cache, table, qsl, ctx, scale, max_query_len=q_len
            )
        )
        ref_ms = b.time_ms(lambda: reference.paged_prefill_attention(q, k_cache, v_cache, table, qsl, ctx, scale))
        visible = n_seq * (q_len * prefix + q_len * (q_len + 1) // 2)  # causal (query, key) pairs
        rows.append(
            Row(
                "paged_prefill",
                f"seqs={n_seq} chunk={q_len} prefix={prefix}",
                ms,
                gbytes=(2 * n_seq * (prefix + q_len) * hkv * d * e + 2 * n_seq * q_len * hq * d * e) / 1e9,
                gflop=4 * visible * hq * d / 1e9,
                torch_ms=ref_ms,
            )
        )
    return rows


# --------------------------------------------------------------------------------------------- io
def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row], copy_gb_s: float, device_name: str) -> None:
    print(f"device: {device_name}   measured copy bandwidth: {copy_gb_s:,.0f} GB/s")
    head = f"{'op':<14} {'case':<44} {'triton ms':>10} {'GB/s':>9} {'%copy':>6} {'TFLOP/s':>8} {'torch ms':>9} {'speedup':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        speed = r.torch_ms / r.triton_ms if r.torch_ms else None
        print(
            f"{r.op:<14} {r.case:<44} {r.triton_ms:>10.4f} {r.gb_s:>9,.0f} {100 * r.gb_s / copy_gb_s:>5.0f}% "
            f"{r.tflop_s:>8.2f} {_fmt(r.torch_ms, '>9.4f'):>9} {_fmt(speed, '>7.1f'):>8}"
        )


def write_json(rows: list[Row], copy_gb_s: float, device_name: str, mode: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "kernels",
        "mode": mode,
        "device": device_name,
        "copy_bandwidth_gb_s": copy_gb_s,
        "rows": [dict(asdict(r), gb_s=r.gb_s, tflop_s=r.tflop_s) for r in rows],
    }
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="no GPU: tiny shapes via TRITON_INTERPRET=1")
    p.add_argument("--quick", action="store_true", help="a few cases of each kind")
    p.add_argument("--only", choices=["sgmv", "attention"], default=None)
    p.add_argument("--out", type=Path, default=RESULTS_JSON)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print(
            "benchmarks/kernels/triton_ops.py: no CUDA device; nothing measured (use --cpu-smoke to exercise "
            "the code path through the Triton interpreter)."
        )
        return 0
    b = Bench(args.cpu_smoke, args.quick)
    device_name = (
        "cpu (Triton interpreter smoke; times are meaningless)" if b.smoke else torch.cuda.get_device_name(b.device)
    )
    copy_gb_s = b.copy_bandwidth_gb_s()
    rows: list[Row] = []
    if args.only in (None, "sgmv"):
        rows += sgmv_rows(b)
    if args.only in (None, "attention"):
        rows += attention_rows(b)
    print_table(rows, copy_gb_s, device_name)
    write_json(rows, copy_gb_s, device_name, "cpu-smoke" if b.smoke else ("quick" if b.quick else "full"), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
