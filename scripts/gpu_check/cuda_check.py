"""One-shot GPU run: every Triton kernel vs the torch reference, kernel timings, and the throughput
and multi-LoRA benchmarks on a random ~1B-parameter Llama; one table, a few minutes on one GPU.

    .venv/bin/python scripts/gpu_check/cuda_check.py            # on a CUDA machine (scripts/gpu-check.sh)
    TRITON_INTERPRET=1 .venv/bin/python scripts/gpu_check/cuda_check.py --smoke   # CPU: tiny shapes, logic only

Kernel rows: max error vs ``kernels/reference.py`` (the oracle, run on the same device), median
time (``triton.testing.do_bench``), and effective bandwidth (bytes the kernel must touch / time)
as a fraction of a measured device-to-device copy. Engine rows: output tok/s of a saturating burst
through ``loraplex.engine.LLM`` for the base model and 8 / 64 adapters (ranks 8-64 on q/k/v/o).
JSON goes to benchmarks/results/gpu_check.json.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _bench(fn, device: str, reps: int) -> float:
    """Median seconds per call."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=5, rep=max(20, reps * 5), return_mode="median") / 1e3
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def copy_bandwidth(device: str) -> float:
    n = (256 << 20) if device == "cuda" else (8 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = _bench(lambda: dst.copy_(src), device, 10)
    return 2 * n / t  # read + write


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-6))


def kernel_rows(device: str, smoke: bool) -> list[dict]:
    from loraplex.kernels import make_lora_segments, reference
    from loraplex.kernels.triton_ops import TRITON_OPS as T

    bw = copy_bandwidth(device)
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    # (label, hidden, q, kv, head_dim, intermediate); smoke: tiny.
    model = ("llama3-8b", 4096, 32, 8, 128, 14336) if not smoke else ("tiny", 128, 4, 2, 32, 256)
    _, hidden, hq, hkv, d, inter = model
    reps = 3 if smoke else 20
    dtypes = (torch.bfloat16, torch.float32)
    for dtype in dtypes:
        dt = str(dtype).removeprefix("torch.")
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        esize = torch.finfo(dtype).bits // 8
        for seg, tokens in ((1, 64), (64, 512)) if not smoke else ((1, 8), (16, 32)):
            slots = [(i // seg) % 8 for i in range(tokens)]
            segs = make_lora_segments(slots, device)
            for rank in (16, 64) if not smoke else (8,):
                for lname, fan_in, widths in (
                    ("qkv", hidden, (hq * d, hkv * d, hkv * d)),
                    ("gate_up", hidden, (inter, inter)),
                ):
                    x = rnd(tokens, fan_in, dtype=dtype)
                    a = rnd(len(widths), 8, rank, fan_in, dtype=dtype, scale=fan_in**-0.5)
                    ranks = torch.full((8,), rank, dtype=torch.int32, device=device)
                    offsets = [0]
                    for w in widths:
                        offsets.append(offsets[-1] + w)
                    b = rnd(8, rank, offsets[-1], dtype=dtype, scale=0.02)
                    scales = torch.full((8,), 2.0, dtype=torch.float32, device=device)
                    s_ref = reference.sgmv_shrink(x, a, segs, ranks)
                    s_tri = T.sgmv_shrink(x, a, segs, ranks)
                    y0 = rnd(tokens, offsets[-1], dtype=dtype)
                    y_ref = reference.sgmv_expand(y0.clone(), s_ref, b, segs, ranks, scales, tuple(offsets))
                    y_tri = T.sgmv_expand(y0.clone(), s_ref, b, segs, ranks, scales, tuple(offsets))
                    used = len(set(slots))
                    shrink_bytes = tokens * fan_in * esize + len(widths) * used * rank * fan_in * esize
                    expand_bytes = 2 * tokens * offsets[-1] * esize + used * rank * offsets[-1] * esize
                    t_s = _bench(lambda: T.sgmv_shrink(x, a, segs, ranks), device, reps)
                    t_e = _bench(lambda: T.sgmv_expand(y0, s_ref, b, segs, ranks, scales, tuple(offsets)), device, reps)
                    for op, err, t, nbytes in (
                        ("sgmv_shrink", _err(s_tri, s_ref), t_s, shrink_bytes),
                        ("sgmv_expand", _err(y_tri, y_ref), t_e, expand_bytes),
                    ):
                        rows.append(
                            {
                                "op": op,
                                "shape": f"{dt} {lname} seg={seg} T={tokens} r={rank}",
                                "rel_err": err,
                                "ok": err <= tol,
                                "us": t * 1e6,
                                "GB_s": nbytes / t / 1e9,
                                "of_copy_bw": nbytes / t / bw,
                            }
                        )
        # Attention: decode over paged KV (many short / one long context), prefill chunks.
        bs = 16
        for num_seqs, ctx in ((64, 512), (1, 4096)) if not smoke else ((4, 40), (1, 100)):
            nb = num_seqs * math.ceil(ctx / bs) + 2
            kc, vc = rnd(nb, bs, hkv, d, dtype=dtype), rnd(nb, bs, hkv, d, dtype=dtype)
            bt = (
                torch.randperm(nb - 2, generator=g)[: num_seqs * math.ceil(ctx / bs)]
                .view(num_seqs, -1)
                .int()
                .to(device)
            )
            lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=device)
            q = rnd(num_seqs, hq, d, dtype=dtype)
            ref = reference.paged_decode_attention(q, kc, vc, bt, lens, d**-0.5)
            out = T.paged_decode_attention(q, kc, vc, bt, lens, d**-0.5)
            err = _err(out, ref)
            t = _bench(lambda: T.paged_decode_attention(q, kc, vc, bt, lens, d**-0.5), device, reps)
            nbytes = 2 * num_seqs * ctx * hkv * d * esize
            rows.append(
                {
                    "op": "decode_attention",
                    "shape": f"{dt} seqs={num_seqs} ctx={ctx}",
                    "rel_err": err,
                    "ok": err <= tol,
                    "us": t * 1e6,
                    "GB_s": nbytes / t / 1e9,
                    "of_copy_bw": nbytes / t / bw,
                }
            )
        qlen = 512 if not smoke else 24
        ctx = qlen + 64
        nb = math.ceil(ctx / bs) + 2
        kc, vc = rnd(nb, bs, hkv, d, dtype=dtype), rnd(nb, bs, hkv, d, dtype=dtype)
        bt = torch.arange(math.ceil(ctx / bs), dtype=torch.int32, device=device)[None]
        qsl = torch.tensor([0, qlen], dtype=torch.int32, device=device)
        lens = torch.tensor([ctx], dtype=torch.int32, device=device)
        q = rnd(qlen, hq, d, dtype=dtype)
        ref = reference.paged_prefill_attention(q, kc, vc, bt, qsl, lens, d**-0.5)
        out = T.paged_prefill_attention(q, kc, vc, bt, qsl, lens, d**-0.5)
        err = _err(out, ref)
        t = _bench(lambda: T.paged_prefill_attention(q, kc, vc, bt, qsl, lens, d**-0.5), device, reps)
        flops = 4 * qlen * ctx * hq * d / 2  # causal: about half the score matrix
        rows.append(
            {
                "op": "prefill_attention",
                "shape": f"{dt} qlen={qlen} ctx={ctx}",
                "rel_err": err,
                "ok": err <= tol,
                "us": t * 1e6,
                "GB_s": None,
                "of_copy_bw": None,
                "TFLOP_s": flops / t / 1e12,
            }
        )
        k_new, v_new = rnd(64, hkv, d, dtype=dtype), rnd(64, hkv, d, dtype=dtype)
        slots = torch.randperm(nb * bs, generator=g)[:64].to(device)
        kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
        reference.write_kv(kc1, vc1, k_new, v_new, slots)
        T.write_kv(kc2, vc2, k_new, v_new, slots)
        ok = torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
        t = _bench(lambda: T.write_kv(kc2, vc2, k_new, v_new, slots), device, reps)
        nbytes = 4 * 64 * hkv * d * esize
        rows.append(
            {
                "op": "write_kv",
                "shape": f"{dt} T=64",
                "rel_err": 0.0 if ok else 1.0,
                "ok": ok,
                "us": t * 1e6,
                "GB_s": nbytes / t / 1e9,
                "of_copy_bw": nbytes / t / bw,
            }
        )
    return rows


def engine_rows(device: str, smoke: bool) -> list[dict]:
    from benchmarks.lib.adapters import RANKS, write_peft_adapter
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.demo_model import create_random_checkpoint

    # ~1B parameters (Llama-3.2-1B-like shapes, small vocab): hidden 2048, 16 layers, GQA 32/8.
    arch = (
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
        )
        if not smoke
        else {}
    )
    n_req, out_tokens = (512, 128) if not smoke else (8, 4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(create_random_checkpoint(Path(tmp) / "m", preset="demo", seed=0, dtype="bfloat16", **arch))
        import json

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        rng = random.Random(0)
        prompts = [[rng.randrange(10, cfg["vocab_size"]) for _ in range(rng.randint(16, 256))] for _ in range(n_req)]
        for n_adapters in (0, 8, 64) if not smoke else (0, 2):
            adapters = {
                f"lora{i}": write_peft_adapter(Path(tmp) / f"lora{i}", model_dir, cfg, RANKS[i % 4], seed=i)
                for i in range(n_adapters)
            }
            t0 = time.perf_counter()
            llm = LLM(
                model_dir,
                dtype="bfloat16",
                device=device,
                max_num_seqs=256 if not smoke else 8,
                max_num_batched_tokens=8192 if not smoke else 64,
                max_loras=max(1, min(n_adapters, 16)),
                max_cpu_loras=max(16, n_adapters),
                max_lora_rank=64,
                kv_cache_memory_gb=16 if not smoke else 0.1,
                scheduling_policy="fcfs",
            )
            startup = time.perf_counter() - t0
            params = sum(p.numel() for p in llm.engine.runner.model.parameters())
            for name, path in adapters.items():
                llm.add_adapter(name, path)
            weights = [1.0 / (i + 1) for i in range(n_adapters)]
            assign = [f"lora{rng.choices(range(n_adapters), weights)[0]}" if n_adapters else None for _ in prompts]
            sp = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
            llm.generate(prompts[:16], sp, adapters=assign[:16])  # warm-up: Triton compiles, allocator
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            outs = llm.generate(prompts, sp, adapters=assign)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
            toks = sum(len(o.token_ids) for o in outs)
            rows.append(
                {
                    "system": f"loraplex {'base' if not n_adapters else f'{n_adapters} adapters'}",
                    "params_M": params / 1e6,
                    "requests": n_req,
                    "output_tok_s": toks / wall,
                    "startup_s": startup,
                }
            )
            del llm
            if device == "cuda":
                torch.cuda.empty_cache()
    base = rows[0]["output_tok_s"]
    for r in rows:
        r["vs_base"] = r["output_tok_s"] / base
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes: checks the script")
    ap.add_argument("--skip-engine", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        print("no CUDA device: use --smoke (with TRITON_INTERPRET=1) to exercise this script on CPU")
        return 2
    from benchmarks.lib.workload import print_table, write_json

    t0 = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter smoke run)"
    print(f"device: {name}", flush=True)
    krows = kernel_rows(device, args.smoke)
    print_table(krows, ["op", "shape", "rel_err", "ok", "us", "GB_s", "of_copy_bw", "TFLOP_s"])
    erows = [] if args.skip_engine else engine_rows(device, args.smoke)
    if erows:
        print()
        print_table(erows, ["system", "params_M", "requests", "output_tok_s", "vs_base", "startup_s"])
    bad = [r for r in krows if not r["ok"]]
    path = write_json(
        "gpu_check", {"device": name, "kernels": krows, "engine": erows, "seconds": time.perf_counter() - t0}
    )
    print(f"\n{len(krows)} kernel checks, {len(bad)} failed; {time.perf_counter() - t0:.0f} s; wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
