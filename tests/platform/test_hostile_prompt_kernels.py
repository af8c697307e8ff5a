"""Hostile checks of the two prompt kernels of commits 3ad6b78 and 6925cf4, where they run by
default: a bf16 engine on a CPU with AVX512-BF16.

* ``kernels/csrc/cpu_prompt_attention.cpp`` (``cpu_native.paged_prefill_attention``): a prefill chunk
  that is a whole prompt of >= 64 tokens runs causal attention on vdpbf16ps pair panels instead of
  torch's SDPA (``prompt_kernel=False`` is the old path).
* ``kernels/csrc/cpu_sgmv.cpp`` (``cpu_sgmv.sgmv_shrink`` / ``sgmv_expand``): LoRA groups of >= 16
  consecutive tokens of one adapter run shrink and expand on vdpbf16ps tiles (``prompt_groups=
  False`` is the old per-token path).

Oracles: (1) a shadow of the ops inside a real engine: every attention / SGMV call the engine makes
(mixed decode, prefix and whole-prompt rows, block tables from a used allocator, adapters of ranks
5, 8, 12 and 16 beside base rows) is recomputed by the old paths and a float64 / float32 reference
and must agree within bf16 rounding; (2) the engine's greedy tokens, output logprobs and prompt
logprobs under the new ops against the old ops (SDPA + per-token SGMV) and the native paged kernel
(``whole_prompt_sdpa=False``): equal up to near-ties (the top-2 margin where they part), logprobs
close; (3) a prefix-cache hit (native paged kernel) against the same prompt computed whole (the new
kernel); (4) ``batch_invariant``: a seeded request is bit-identical alone and in a mixed batch, and
the new kernels stay off; float32 keeps SDPA; (5) a real ``loraplex serve`` answering a concurrent
hostile mix with adapters deleted and re-uploaded under load: no 5xx, every stream ends with [DONE],
no NaN logprobs, json_schema answers parse, no traceback in the log."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import json
import math
from pathlib import Path

import httpx
import pytest
import torch
from billing_helpers import auth, new_adapter, new_tenant
from harness.adapters import adapter_files, make_peft_adapter
from harness.serve import ServeProcess
from hostile_http_helpers import fire, logprob_numbers, payloads
from platform_helpers import ADMIN_KEY

from loraplex.engine import LLM, EngineRequest, OutputKind, SamplingParams
from loraplex.kernels import cpu_native, cpu_prompt_attention, cpu_sgmv, reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVERY = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# bf16 explicitly ("auto" picks float32 on a CPU without native bf16, where nothing new runs).
ENGINE = {"dtype": "bfloat16", "max_num_seqs": 16, "max_loras": 4, "max_lora_rank": 16, "max_model_len": 2048}
# The prompt lengths around the thresholds (16 tokens: SGMV tiles; 64: whole-prompt kernel, its
# 64-row work items; 16-key panels), long prompts, and one near max_model_len.
LENGTHS = [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 300, 1000]
LONG = 2000  # with max_tokens 8: near max_model_len (2048)
# Logprob agreement of two bf16 paths (measured max 0.015 over these prompts). The demo model's
# logits are flat (top-2 margins often < 0.01), so these engine-level checks are coarse: the shadow
# oracle below bounds every op call against float references relative to the tensors' own size.
LP_TOL = 0.05
TIE = 0.03  # two greedy runs may part only where the top-2 logprobs are this close (measured: 1e-4)


def _kernels_here() -> bool:
    return cpu_native.available() and cpu_native.prompt_kernel_isa() and cpu_sgmv.prompt_groups_available()


needs_kernels = pytest.mark.skipif(not _kernels_here(), reason="no AVX512-BF16 prompt kernels on this CPU")


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 660, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def adapters(demo_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prompt-kernel-adapters")
    return {
        "r8": make_peft_adapter(demo_model_dir, root / "r8", r=8, alpha=16, targets=EVERY, seed=1),
        "r16": make_peft_adapter(demo_model_dir, root / "r16", r=16, alpha=32, targets=EVERY, seed=2),
        "r5": make_peft_adapter(demo_model_dir, root / "r5", r=5, alpha=10, targets=EVERY, seed=3),
        "r12": make_peft_adapter(
            demo_model_dir,
            root / "r12",
            r=12,
            alpha=12,
            targets=("q_proj", "v_proj", "gate_proj", "down_proj"),
            seed=4,
        ),  # fmt: skip
    }


def _engine(model_dir: Path, adapters: dict[str, Path] | None, **kw) -> LLM:
    llm = LLM(model=str(model_dir), **{**ENGINE, **kw})
    if llm.engine.runner.ops.name not in ("cpu", "cpu+batch_invariant") or cpu_native._lib is None:
        pytest.skip("the native CPU kernels are not built here")
    for name, path in (adapters or {}).items():
        llm.add_adapter(name, str(path))
    return llm


@pytest.fixture(scope="module")
def llm(demo_model_dir, adapters):
    if not _kernels_here():
        pytest.skip("no AVX512-BF16 prompt kernels on this CPU")
    return _engine(demo_model_dir, adapters, num_kv_blocks=600, enable_prefix_caching=False)


# ------------------------------------------------------------------------------------ op variants
def old_ops(ops):
    """What ran before the two commits: SDPA for whole prompts, the per-token SGMV loops."""
    return dataclasses.replace(
        ops,
        paged_prefill_attention=functools.partial(ops.paged_prefill_attention, prompt_kernel=False),
        sgmv_shrink=functools.partial(ops.sgmv_shrink, prompt_groups=False),
        sgmv_expand=functools.partial(ops.sgmv_expand, prompt_groups=False),
    )


def paged_ops(ops):
    """Every prefill row on the native paged kernel (an implementation independent of both)."""
    return dataclasses.replace(
        ops,
        paged_prefill_attention=functools.partial(ops.paged_prefill_attention, whole_prompt_sdpa=False),
        sgmv_shrink=functools.partial(ops.sgmv_shrink, prompt_groups=False),
        sgmv_expand=functools.partial(ops.sgmv_expand, prompt_groups=False),
    )


def _run(llm: LLM, ops, prompts, params, adapters=None):
    plain = llm.engine.runner.ops
    llm.engine.runner.ops = ops
    try:
        return llm.generate(prompts, params, adapters=adapters)
    finally:
        llm.engine.runner.ops = plain


class Counters:
    """Counts where the new kernels really ran: the whole-prompt kernel's calls (their prompt
    lengths) and the SGMV calls that took the ``_groups`` entry points."""

    def __init__(self, monkeypatch):
        self.prompt_lens: list[int] = []
        self.group_calls = 0
        real_attn, real_fn = cpu_prompt_attention.attend, cpu_sgmv._prompt_group_fn

        def attn(q, out, k, v, bt, seqs, starts, lens, scale, *, lib, offsets=None):
            self.prompt_lens.extend(lens)
            return real_attn(q, out, k, v, bt, seqs, starts, lens, scale, lib=lib, offsets=offsets)

        def group_fn(*a):
            fn = real_fn(*a)
            self.group_calls += fn is not None
            return fn

        monkeypatch.setattr(cpu_prompt_attention, "attend", attn)
        monkeypatch.setattr(cpu_sgmv, "_prompt_group_fn", group_fn)


# ------------------------------------------------------------------------------- float64 oracles
def _oracle_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale, max_ctx=700):
    """float64 attention of every sequence with at most ``max_ctx`` keys (rows of the others NaN):
    row i of sequence s sees positions < ctx[s] - qlen + i + 1."""
    out = torch.full(q.shape, float("nan"), dtype=torch.float64)
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    hq = q.shape[1]
    for s in range(len(ctx)):
        a, b, c = int(qsl[s]), int(qsl[s + 1]), int(ctx[s])
        if b == a or c > max_ctx:
            continue
        blocks = block_tables[s, : -(-c // bs)].long()
        k = k_cache[blocks].reshape(-1, hkv, k_cache.shape[3])[:c].double().repeat_interleave(hq // hkv, dim=1)
        v = v_cache[blocks].reshape(-1, hkv, v_cache.shape[3])[:c].double().repeat_interleave(hq // hkv, dim=1)
        qs = q[a:b].double()
        scores = torch.einsum("ihd,jhd->hij", qs, k) * scale
        pos = torch.arange(c - (b - a), c).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(c).unsqueeze(0) > pos, float("-inf"))
        out[a:b] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)
    return out


class Shadow:
    """Engine ops whose prefill attention and SGMV are the new paths, each call checked against the
    old paths and a float reference on the very tensors the engine passed (strided q, used block
    tables, decode + prefix + whole-prompt rows in one call, several adapters and base rows)."""

    def __init__(self, ops):
        self.ops = ops
        self.attn_calls = self.fresh_rows = self.shrink_calls = self.expand_calls = 0
        self.worst: dict[str, float] = {}
        self.failures: list[str] = []

    def _note(self, what: str, err: float, bound: float, info: str) -> None:
        self.worst[what] = max(self.worst.get(what, 0.0), err / bound if bound else err)
        if not err <= bound:  # NaN fails too
            self.failures.append(f"{what}: err {err:.4g} > {bound:.4g} ({info})")

    def replaced(self):
        return dataclasses.replace(
            self.ops, paged_prefill_attention=self.attention, sgmv_shrink=self.shrink, sgmv_expand=self.expand
        )

    def attention(self, q, k_cache, v_cache, block_tables, qsl, ctx, scale):
        out = cpu_native.paged_prefill_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale)
        self.attn_calls += 1
        starts, lens = qsl.tolist(), ctx.tolist()
        fresh = [s for s, c in enumerate(lens) if starts[s + 1] - starts[s] == c >= cpu_native.SDPA_MIN_ROWS]
        self.fresh_rows += sum(lens[s] for s in fresh)
        info = f"qlens {[starts[s + 1] - starts[s] for s in range(len(lens))]} ctx {lens}"
        finite = bool(torch.isfinite(q).all() and torch.isfinite(k_cache).all() and torch.isfinite(v_cache).all())
        if not finite:
            return out
        if not torch.isfinite(out).all():
            self.failures.append(f"attention: non-finite output from finite inputs ({info})")
            return out
        want = _oracle_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale)
        rows = ~want.isnan().any(-1).any(-1)
        if rows.any():
            scale_v = float(want[rows].abs().max())
            self._note("attention vs float64", float((out.double() - want)[rows].abs().max()), 2**-6 * scale_v, info)
        sdpa = cpu_native.paged_prefill_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale,
                                                  prompt_kernel=False)  # fmt: skip
        paged = cpu_native.paged_prefill_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale,
                                                   whole_prompt_sdpa=False)  # fmt: skip
        ref = float(paged.double().abs().max())
        self._note("attention vs SDPA", float((out.double() - sdpa.double()).abs().max()), 2**-5 * ref, info)
        self._note("attention vs paged", float((out.double() - paged.double()).abs().max()), 2**-5 * ref, info)
        return out

    def shrink(self, x, lora_a, segments, ranks):
        out = cpu_sgmv.sgmv_shrink(x, lora_a, segments, ranks)
        self.shrink_calls += 1
        if segments.has_lora and torch.isfinite(x).all() and torch.isfinite(lora_a).all():
            want = reference.sgmv_shrink(x.float(), lora_a.float(), segments, ranks)
            scale_v = max(float(want.abs().max()), 1e-6)
            self._note("shrink vs float32", float((out - want).abs().max()), 1e-3 * scale_v, f"{segments.slots_list}")
        return out

    def expand(self, y, shrunk, lora_b, segments, ranks, scales, slice_offsets):
        y0 = y.clone()
        out = cpu_sgmv.sgmv_expand(y, shrunk, lora_b, segments, ranks, scales, slice_offsets)
        self.expand_calls += 1
        if segments.has_lora and torch.isfinite(y0).all() and torch.isfinite(shrunk).all():
            want = reference.sgmv_expand(
                y0.float(), shrunk.float(), lora_b.float(), segments, ranks, scales, slice_offsets
            ).double()
            delta = want - y0.double()
            # One bf16 rounding of y + delta, plus the tiles' bf16 rounding of the shrunk
            # activations (a relative 2^-8 of each rank term: bounded by the delta's size).
            bound = 2**-7 * want.abs() + 2**-6 * float(delta.abs().max()) + 1e-30
            err = ((out.double() - want).abs() / bound).max()
            self._note("expand vs float32", float(err), 1.0, f"{segments.slots_list}")
        return out


def _finite_lps(out) -> None:
    for c in out.outputs:
        for lp in c.logprobs or []:
            assert math.isfinite(lp.logprob), (out.request_id, lp)
            assert all(math.isfinite(v) for _, v in lp.top), (out.request_id, lp)
    for lp in out.prompt_logprobs or []:
        assert math.isfinite(lp.logprob), (out.request_id, lp)


def _agree(a, b, what: str) -> int:
    """Two greedy completions: equal tokens up to a near-tie (the token b chose is within TIE of
    a's top-1 at the first position they part), logprobs within LP_TOL before it. Returns the
    length of the common prefix."""
    ta, tb = a.token_ids, b.token_ids
    n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    for i in range(n):
        la, lb = a.logprobs[i].logprob, b.logprobs[i].logprob
        assert abs(la - lb) <= LP_TOL, (what, i, la, lb)
    if n < min(len(ta), len(tb)):
        top_a = dict(a.logprobs[n].top)
        assert tb[n] in top_a, (what, n, "b's token not in a's top", a.logprobs[n], b.logprobs[n])
        margin = top_a[ta[n]] - top_a[tb[n]]
        assert margin <= TIE, (what, n, "parted at a clear winner", margin, a.logprobs[n], b.logprobs[n])
    return n


def _prompt_lps_close(a, b, what: str) -> float:
    pa, pb = a.prompt_logprobs, b.prompt_logprobs
    assert pa is not None and pb is not None and len(pa) == len(pb), what
    worst = 0.0
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert x.token_id == y.token_id
        d = abs(x.logprob - y.logprob)
        worst = max(worst, d)
        assert d <= LP_TOL, (what, i, x, y)
    return worst


# -------------------------------------------------------------------------------- the op alone
def _paged(lengths, bs=16, hkv=2, d=32, seed=0, fill=None):
    """A paged bf16 cache holding ``lengths`` keys per sequence in shuffled blocks (a used pool)."""
    g = torch.Generator().manual_seed(seed)
    per = [-(-n // bs) for n in lengths]
    total = sum(per) + 5
    k_cache = torch.randn(total, bs, hkv, d, generator=g).bfloat16()
    v_cache = torch.randn(total, bs, hkv, d, generator=g).bfloat16()
    perm = torch.randperm(total, generator=g)
    tables = torch.zeros(len(lengths), max(per) + 2, dtype=torch.int32)
    used = 0
    for s, n in enumerate(per):
        tables[s, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return k_cache, v_cache, tables


@needs_kernels
def test_the_op_on_a_mixed_call_with_a_poisoned_prompt_beside_healthy_ones():
    """One call as the engine makes it: whole prompts of 64, 65 and 200 tokens, a chunk over a
    cached prefix, a 1-token chunk, an empty chunk and a 63-token whole prompt, head dim 32, GQA 2;
    every row within bf16 rounding of the float64 oracle. Then one whole prompt's queries overflow
    (1e30): its rows may be NaN / inf (SDPA's are), but the other prompts' rows keep their bits."""
    hq, hkv, d = 4, 2, 32
    qlens = [64, 30, 65, 1, 0, 200, 63]
    ctx = [64, 130, 65, 77, 40, 200, 63]
    k_cache, v_cache, tables = _paged(ctx, hkv=hkv, d=d, seed=7)
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(sum(qlens), hq + 2 * hkv, d, generator=g).bfloat16()
    q = qkv[:, :hq]
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    ctx_t = torch.tensor(ctx, dtype=torch.int32)
    scale = d**-0.5
    assert cpu_native.prompt_kernel_applies(q)
    out = cpu_native.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale)
    want = _oracle_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale, max_ctx=10**6)
    assert torch.isfinite(out).all()
    err = float((out.double() - want).abs().max())
    assert err <= 2**-6 * float(want.abs().max()), err
    # Huge but finite scores (queries 1e30): attention becomes one-hot on the best key, as in float64.
    peaky = q.clone()
    peaky[94:159] = peaky[94:159] * 1e30
    got = cpu_native.paged_prefill_attention(peaky, k_cache, v_cache, tables, qsl, ctx_t, scale)
    want = _oracle_attention(peaky, k_cache, v_cache, tables, qsl, ctx_t, scale, max_ctx=10**6)
    assert torch.isfinite(got).all()
    err = float((got.double() - want).abs().max())
    assert err <= 2**-6 * float(want.abs().max()), err
    # Poison the 65-token whole prompt (rows 94..158): queries 1e38, scores overflow to +-inf / NaN.
    bad = q.clone()
    bad[94:159] = 1e38
    poisoned = cpu_native.paged_prefill_attention(bad, k_cache, v_cache, tables, qsl, ctx_t, scale)
    sdpa = cpu_native.paged_prefill_attention(bad, k_cache, v_cache, tables, qsl, ctx_t, scale, prompt_kernel=False)
    healthy = torch.ones(q.shape[0], dtype=torch.bool)
    healthy[94:159] = False
    assert torch.equal(poisoned[healthy], out[healthy]), "a poisoned prompt changed its neighbours' rows"
    # Where SDPA says the poisoned rows are not finite, the kernel must not answer finite numbers
    # (the engine fails a request on a non-finite hidden state; finite garbage would be served).
    sdpa_bad = ~torch.isfinite(sdpa[94:159]).all(-1).all(-1)
    kern_bad = ~torch.isfinite(poisoned[94:159]).all(-1).all(-1)
    assert bool((kern_bad | ~sdpa_bad).all()), (
        f"rows SDPA makes non-finite but the kernel answers finite: {(sdpa_bad & ~kern_bad).nonzero().flatten()[:10]}"
    )


@needs_kernels
def test_sgmv_tiles_keep_a_poisoned_prompt_from_its_neighbours_in_one_group():
    """Two prompts of one adapter back to back (one group of 70 consecutive tokens: tiles of 32 rows
    that straddle the two) beside a decode row of another slot and base rows: poisoning the first
    prompt's activations (inf / NaN) leaves every other row's shrink and expand bits unchanged."""
    from loraplex.kernels import make_lora_segments

    g = torch.Generator().manual_seed(3)
    hidden, ranks_l, widths = 128, [16, 5], [128, 64, 64]
    slots = [0] * 30 + [0] * 40 + [1] + [-1] * 20
    seg = make_lora_segments(slots)
    max_rank = max(ranks_l)
    a = (torch.randn(len(widths), 2, max_rank, hidden, generator=g) * 0.1).bfloat16()
    b = (torch.randn(2, max_rank, sum(widths), generator=g) * 0.1).bfloat16()
    ranks = torch.tensor(ranks_l, dtype=torch.int32)
    scales = torch.tensor([2.0, 0.5])
    offsets = (0, 128, 192, 256)
    x = torch.randn(len(slots), hidden, generator=g).bfloat16()
    y = torch.randn(len(slots), sum(widths), generator=g).bfloat16()

    def run(xx):
        shrunk = cpu_sgmv.sgmv_shrink(xx, a, seg, ranks)
        return shrunk, cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)

    shrunk, out = run(x)
    want = reference.sgmv_expand(y.float(), reference.sgmv_shrink(x.float(), a.float(), seg, ranks), b.float(), seg,
                                 ranks, scales, offsets).double()  # fmt: skip
    delta = want - y.double()
    assert float((out.double() - want).abs().max()) <= 2**-7 * float(want.abs().max()) + 2**-6 * float(
        delta.abs().max()
    )
    for poison in (float("inf"), float("nan")):
        bad = x.clone()
        bad[3:30] = poison
        shrunk_p, out_p = run(bad)
        rows = torch.ones(len(slots), dtype=torch.bool)
        rows[3:30] = False
        assert torch.equal(shrunk_p[:, rows], shrunk[:, rows]), poison
        assert torch.equal(out_p[rows], out[rows]), poison
        assert not torch.isfinite(out_p[3:30]).all(), "a poisoned row came back finite"


# ----------------------------------------------------------------------------- in-process engine
@needs_kernels
def test_the_new_kernels_run_where_documented_and_not_elsewhere(llm, monkeypatch):
    """15 tokens: no prompt kernel; 16: one call for it; a step's prompt chunks in one call;
    adapter rows of >= 16 tokens reach the SGMV groups entry point; base-only rows do not."""
    c = Counters(monkeypatch)
    greedy = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    below = cpu_native.KERNEL_MIN_ROWS - 1
    llm.generate([_ids(below, 1)], greedy, adapters=[None])
    assert c.prompt_lens == [] and c.group_calls == 0
    llm.generate([_ids(below + 1, 2)], greedy, adapters=[None])
    assert c.prompt_lens == [below + 1] * 4  # one call per layer (4 layers)
    assert c.group_calls == 0  # no adapter: has_lora is False, SGMV returns before
    c.prompt_lens.clear()
    llm.generate([_ids(17, 3)], greedy, adapters=["r5"])
    assert c.prompt_lens == [17] * 4 and c.group_calls > 0
    c.prompt_lens.clear()
    outs = llm.generate([_ids(n, 10 + n) for n in (64, 65, 129, 30)], greedy, adapters=["r8", None, "r16", "r12"])
    assert all(o.error is None for o in outs)
    # (a burst may go in groups and a prompt joining decodes is cut into chunks; every chunk of at
    # least KERNEL_MIN_ROWS rows, whole prompt or not, reaches the kernel)
    assert 30 in c.prompt_lens and min(c.prompt_lens) >= cpu_native.KERNEL_MIN_ROWS, c.prompt_lens
    assert max(c.prompt_lens) <= 129 and sum(c.prompt_lens) >= 4 * (64 + 65 + 129 + 30 - 3 * 15), c.prompt_lens


def _waves(llm: LLM, ops, first: list, later: list, steps_between: int = 3) -> list:
    """``first`` (prompt, params, adapter) requests, ``steps_between`` engine steps, then ``later``
    ones joining the running decodes; every output, in order."""
    plain = llm.engine.runner.ops
    llm.engine.runner.ops = ops
    try:
        ids = []

        def add(batch):
            for prompt, params, adapter in batch:
                req = EngineRequest(prompt, params, adapter=adapter, output_kind=OutputKind.FINAL_ONLY)
                ids.append(llm.engine.add_request(req).request_id)

        done: dict[str, object] = {}

        def step():
            for out in llm.engine.step():
                if out.finished:
                    done[out.request_id] = out

        add(first)
        for _ in range(steps_between):
            step()
        add(later)
        for _ in range(5000):
            if len(done) == len(ids):
                break
            step()
        assert len(done) == len(ids), "the engine did not finish every request"
        return [done[i] for i in ids]
    finally:
        llm.engine.runner.ops = plain


@needs_kernels
def test_every_engine_call_of_the_new_ops_matches_the_old_paths_and_the_oracle(llm):
    """The shadow ops on a mixed workload: prompts of every threshold length with each adapter
    (ranks 5/8/12/16) and base rows, n > 1 forks, then a second wave of whole prompts joining the
    running decodes (one attention call with decode rows, continuing chunks and whole prompts)."""
    shadow = Shadow(llm.engine.runner.ops)
    cycle = [None, "r8", "r16", "r5", "r12"]
    prompts = [_ids(n, 100 + n) for n in LENGTHS]
    adapters = [cycle[i % 5] for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2) for _ in prompts]
    params[3] = SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3, ignore_eos=True, logprobs=2)
    params[8] = SamplingParams(max_tokens=6, temperature=0.7, seed=4, n=2, ignore_eos=True, logprobs=2)
    outs = _run(llm, shadow.replaced(), prompts, params, adapters)
    decoding = [(_ids(5 + i, 200 + i), SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=1),
                 cycle[i % 5]) for i in range(8)]  # fmt: skip
    joining = [(_ids(n, 300 + n), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1),
                cycle[(i + 1) % 5]) for i, n in enumerate((64, 96, 130, 256, 511, 80, 16, 20))]  # fmt: skip
    outs += _waves(llm, shadow.replaced(), decoding, joining)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    for o in outs:
        _finite_lps(o)
    assert shadow.fresh_rows > 0 and shadow.shrink_calls > 0 and shadow.expand_calls > 0
    assert not shadow.failures, shadow.failures[:10]
    print("shadow worst err / bound:", shadow.worst)


# (arch, checkpoint overrides, engine settings, whether the whole-prompt kernel applies)
SHAPES = {
    # MQA (4 query heads on 1 KV head), head dim 48 (3 panels), 8-token blocks, a KV pool that
    # forces preemption (recomputed prompts come back as whole prompts).
    "llama-mqa-d48-bs8-preempt": (
        "llama",
        {"hidden_size": 192, "num_attention_heads": 4, "num_key_value_heads": 1},
        {"block_size": 8, "num_kv_blocks": 120, "enable_prefix_caching": False},
        True,
    ),
    # Qwen2 (q/k/v bias), head dim 80 (5 panels), 32-token blocks, ngram speculation (verify rows).
    "qwen2-d80-bs32-ngram": (
        "qwen2",
        {"hidden_size": 160, "num_attention_heads": 2, "num_key_value_heads": 2},
        {"block_size": 32, "num_kv_blocks": 200, "speculative_method": "ngram"},
        True,
    ),
    # Head dim 24: not a multiple of 16, whole prompts stay on SDPA.
    "llama-d24": (
        "llama",
        {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2},
        {"num_kv_blocks": 300},
        False,
    ),
    # int8 weights beside bf16 activations and adapters, prefix caching on.
    "demo-int8": ("llama", {}, {"quantization": "int8", "num_kv_blocks": 300}, True),
}


@needs_kernels
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_shadow_holds_on_other_model_shapes_and_engine_settings(shape, tmp_path, monkeypatch):
    from loraplex.engine.demo_model import create_random_checkpoint

    arch, overrides, settings, applies = SHAPES[shape]
    model = create_random_checkpoint(tmp_path / "model", arch=arch, seed=5, **overrides)
    ads = {
        "a8": make_peft_adapter(model, tmp_path / "a8", r=8, alpha=16, targets=EVERY, seed=1),
        "a5": make_peft_adapter(model, tmp_path / "a5", r=5, alpha=10, targets=("q_proj", "v_proj", "down_proj")),
    }
    llm = _engine(model, ads, **settings)
    c = Counters(monkeypatch)
    shadow = Shadow(llm.engine.runner.ops)
    cycle = [None, "a8", "a5"]
    lengths = [1, 16, 17, 63, 64, 65, 128, 129, 300, 700]
    prompts = [_ids(n, 40 + n) for n in lengths] + [[7, 8, 9, 10] * 40]  # a repetitive one: ngram drafts
    adapters = [cycle[i % 3] for i in range(len(prompts))]
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2) for _ in prompts]
    params[4] = SamplingParams(max_tokens=24, temperature=1.0, seed=1, n=2, ignore_eos=True, logprobs=2)
    outs = _run(llm, shadow.replaced(), prompts, params, adapters)
    again = _run(llm, shadow.replaced(), prompts[4:8], params[4:8], adapters[4:8])  # prefix hits where cached
    assert all(o.error is None for o in outs + again), [o.error for o in outs + again]
    for o in outs + again:
        _finite_lps(o)
    assert not shadow.failures, shadow.failures[:10]
    assert shadow.attn_calls > 0 and shadow.expand_calls > 0
    if applies:
        assert any(n >= 64 for n in c.prompt_lens), c.prompt_lens
    else:
        assert c.prompt_lens == []
    if "num_kv_blocks" in settings and settings["num_kv_blocks"] < 200:
        assert llm.engine.counters["preemptions"] > 0, "the pool was meant to force a preemption"
    # And the engine's answers agree with the old paths (greedy rows).
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    old = _run(llm, old_ops(llm.engine.runner.ops), [prompts[i] for i in greedy], [params[i] for i in greedy],
               [adapters[i] for i in greedy])  # fmt: skip
    for i, b in zip(greedy, old):
        _agree(outs[i].outputs[0], b.outputs[0], f"{shape}: prompt {i} ({lengths[i] if i < len(lengths) else 160})")
    print(shape, "shadow worst err / bound:", shadow.worst)


@needs_kernels
def test_greedy_and_prompt_logprobs_agree_with_the_old_paths_and_the_paged_kernel(llm):
    """Every threshold length (and one of 2000 tokens, near max_model_len) with each adapter and the
    base model, prompt logprobs and top-2 logprobs: new ops vs SDPA + per-token SGMV vs the native
    paged kernel. Greedy tokens equal up to near-ties, every logprob finite and close."""
    cycle = [None, "r8", "r16", "r5", "r12"]
    prompts = [_ids(n, 500 + n) for n in [*LENGTHS, LONG]]
    prompts.append([100] * 300)  # a long run of one token
    prompts.append([0] * 100)  # <|endoftext|> (id 0) repeated
    adapters = [cycle[i % 5] for i in range(len(prompts))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    new = _run(llm, llm.engine.runner.ops, prompts, params, adapters)
    old = _run(llm, old_ops(llm.engine.runner.ops), prompts, params, adapters)
    paged = _run(llm, paged_ops(llm.engine.runner.ops), prompts, params, adapters)
    worst = 0.0
    for i, (a, b, c) in enumerate(zip(new, old, paged)):
        assert a.error is None and b.error is None and c.error is None, (a.error, b.error, c.error)
        for o in (a, b, c):
            _finite_lps(o)
        what = f"prompt {i} ({len(prompts[i])} tokens, adapter {adapters[i]})"
        _agree(a.outputs[0], b.outputs[0], what + " new vs old")
        _agree(a.outputs[0], c.outputs[0], what + " new vs paged")
        if len(prompts[i]) > 1:
            worst = max(worst, _prompt_lps_close(a, b, what + " new vs old"), _prompt_lps_close(a, c, what))
    print(f"worst prompt logprob difference {worst:.4f}")


@needs_kernels
def test_an_adapter_changes_a_long_prompts_answer_through_the_tiles(llm):
    """The tiles apply the adapter (a wrong or missing update would leave the base model's answer):
    the prompt logprobs of a 200-token prompt under r16 are not the base model's, and they are the
    per-token path's within bf16 rounding."""
    prompt = _ids(200, 77)
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    base = llm.generate([prompt], params, adapters=[None])[0]
    tiles = llm.generate([prompt], params, adapters=["r16"])[0]
    loops = _run(llm, old_ops(llm.engine.runner.ops), [prompt], params, ["r16"])[0]
    moved = max(abs(x.logprob - y.logprob) for x, y in zip(base.prompt_logprobs, tiles.prompt_logprobs))
    assert moved > 4 * max(abs(x.logprob - y.logprob) for x, y in zip(tiles.prompt_logprobs, loops.prompt_logprobs))
    _prompt_lps_close(tiles, loops, "r16 tiles vs loops")


@needs_kernels
def test_prefix_cache_hits_agree_with_the_whole_prompt_kernel(demo_model_dir, adapters, llm):
    """A 300-token prompt twice (the second a prefix-cache hit: the native paged kernel), then 430
    tokens over it (a hit again), against the same prompts computed whole (the new kernel) in an
    engine without a prefix cache; n = 3 greedy forks of one prompt give one answer."""
    pc = _engine(demo_model_dir, adapters, num_kv_blocks=400, enable_prefix_caching=True)
    p = _ids(300, 900)
    longer = p + _ids(130, 901)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    for adapter in (None, "r16", "r5"):
        first = pc.generate([p], greedy, adapters=[adapter])[0]
        again = pc.generate([p], greedy, adapters=[adapter])[0]
        over = pc.generate([longer], greedy, adapters=[adapter])[0]
        assert again.metrics["num_cached_tokens"] >= 256, again.metrics
        assert over.metrics["num_cached_tokens"] >= 256, over.metrics
        whole = llm.generate([p, longer], greedy, adapters=[adapter, adapter])
        for o in (first, again, over, *whole):
            assert o.error is None, o.error
            _finite_lps(o)
        _agree(first.outputs[0], again.outputs[0], f"{adapter}: hit vs whole")
        _agree(whole[0].outputs[0], again.outputs[0], f"{adapter}: no-cache engine vs hit")
        _agree(whole[1].outputs[0], over.outputs[0], f"{adapter}: longer, no-cache vs hit")
        forks = pc.generate([_ids(150, 902)], SamplingParams(n=3, max_tokens=10, temperature=0, ignore_eos=True,
                                                                logprobs=1), adapters=[adapter])[0]  # fmt: skip
        assert forks.error is None and len(forks.outputs) == 3
        assert len({tuple(c.token_ids) for c in forks.outputs}) == 1, [c.token_ids for c in forks.outputs]


@needs_kernels
def test_batch_invariant_rows_are_bit_identical_and_the_new_kernels_stay_off(demo_model_dir, adapters, monkeypatch):
    """``batch_invariant``: a seeded n = 2 request on r16 with a 200-token prompt and a greedy one on
    r5 with 64 tokens give the same tokens and logprobs, to the bit, alone and inside a batch of
    other adapters' whole prompts of 16 to 300 tokens; the whole-prompt kernel never runs and the
    SGMV never takes the groups entry point."""
    inv = _engine(demo_model_dir, adapters, batch_invariant=True, num_kv_blocks=400, enable_prefix_caching=False)
    c = Counters(monkeypatch)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=11, n=2, ignore_eos=True, logprobs=3)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=1)
    a_prompt, b_prompt = _ids(200, 40), _ids(64, 41)
    alone_a = inv.generate([a_prompt], seeded, adapters=["r16"])[0]
    alone_b = inv.generate([b_prompt], greedy, adapters=["r5"])[0]
    others = [_ids(n, 50 + n) for n in (16, 17, 65, 128, 300, 64)]
    prompts = [others[0], a_prompt, *others[1:4], b_prompt, *others[4:]]
    ads = ["r8", "r16", "r16", None, "r12", "r5", "r8", "r5"]
    params = [SamplingParams(max_tokens=10, temperature=0.9, seed=i, ignore_eos=True) for i in range(len(prompts))]
    params[1], params[5] = seeded, greedy
    mixed = inv.generate(prompts, params, adapters=ads)

    def digest(o):
        return (
            [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs]) for c in o.outputs],
            [(lp.token_id, lp.logprob) for lp in o.prompt_logprobs or []],
        )

    assert digest(mixed[1]) == digest(alone_a)
    assert digest(mixed[5]) == digest(alone_b)
    assert c.prompt_lens == [] and c.group_calls == 0


@needs_kernels
def test_two_engines_in_two_threads_get_the_bits_they_get_alone(demo_model_dir, adapters, llm):
    """The native calls release the GIL: two engines of one process running long prompts through the
    whole-prompt kernel and the SGMV tiles at the same time (OpenMP regions from two threads, the
    tiles' thread-local panels) give exactly what each gives alone."""
    import threading

    other = _engine(demo_model_dir, adapters, num_kv_blocks=300, enable_prefix_caching=False)
    work = {
        "a": (llm, [_ids(n, 7000 + n) for n in (64, 300, 129, 700)], ["r16", "r5", None, "r12"]),
        "b": (other, [_ids(n, 8000 + n) for n in (65, 511, 128, 16)], ["r8", "r16", "r5", None]),
    }
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=1)

    def digest(outs):
        return [
            ([(c.token_ids, [(lp.token_id, lp.logprob) for lp in c.logprobs]) for c in o.outputs],
             [lp.logprob for lp in o.prompt_logprobs or []], o.error)
            for o in outs
        ]  # fmt: skip

    alone = {k: digest(e.generate(p, params, adapters=a)) for k, (e, p, a) in work.items()}
    got: dict[str, list] = {}
    for _ in range(2):
        threads = [threading.Thread(target=lambda k=k, w=w: got.__setitem__(k, digest(w[0].generate(w[1], params,
                   adapters=w[2])))) for k, w in work.items()]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "a generate hung"
        assert got == alone


@needs_kernels
def test_a_float32_engine_keeps_sdpa_and_the_per_token_sgmv(demo_model_dir, adapters, monkeypatch):
    f32 = _engine(demo_model_dir, adapters, dtype="float32", num_kv_blocks=200, enable_prefix_caching=False)
    c = Counters(monkeypatch)
    outs = f32.generate([_ids(n, n) for n in (64, 129, 300)], SamplingParams(max_tokens=4, temperature=0, logprobs=1),
                        adapters=["r16", None, "r5"])  # fmt: skip
    assert all(o.error is None for o in outs)
    for o in outs:
        _finite_lps(o)
    assert c.prompt_lens == [] and c.group_calls == 0


@needs_kernels
def test_an_overflowing_adapter_on_a_long_prompt_fails_cleanly_and_spares_its_neighbours(
    demo_model_dir, adapters, llm, tmp_path
):
    """An adapter whose q/k LoRA B is scaled 1e33 (scores overflow to inf / NaN in the prompt
    kernel's first product) on prompts of 64-300 tokens: the request fails with the engine's
    'not finite' error, never answers tokens; a base and an r8 request in the same batch answer as
    they do alone (up to near-ties)."""
    import shutil

    from safetensors.torch import load_file, save_file

    huge = tmp_path / "huge"
    shutil.copytree(adapters["r8"], huge)
    f = huge / "adapter_model.safetensors"
    save_file({k: v * (1e33 if "lora_B" in k and ("q_proj" in k or "k_proj" in k) else 1.0)
               for k, v in load_file(str(f)).items()}, str(f))  # fmt: skip
    llm.add_adapter("huge", str(huge))
    try:
        greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
        for n in (64, 100, 300):
            prompts = [_ids(n, 1), _ids(n, 2), _ids(n, 3)]
            outs = llm.generate(prompts, greedy, adapters=["huge", None, "r8"])
            assert outs[0].error is not None and "not finite" in outs[0].error, (n, outs[0].error, outs[0].token_ids)
            alone = llm.generate(prompts[1:], greedy, adapters=[None, "r8"])
            for a, b in zip(outs[1:], alone):
                assert a.error is None
                _finite_lps(a)
                _agree(b.outputs[0], a.outputs[0], f"neighbour of the overflowing adapter, {n} tokens")
    finally:
        llm.remove_adapter("huge")


@needs_kernels
def test_hostile_texts_in_process_agree_with_the_old_paths(llm):
    tok = llm.tokenizer
    texts = ["\u0000" * 80, "🤖" * 40, "<|endoftext|>" * 70, "a" * 500, "日本語 \u202e" * 30, " " * 400]
    prompts = [tok.encode(t) for t in texts]
    assert all(len(p) >= 64 for p in prompts), [len(p) for p in prompts]
    adapters = ["r8", None, "r16", "r5", "r12", "r8"]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=2, prompt_logprobs=1)
    new = llm.generate(prompts, params, adapters=adapters)
    old = _run(llm, old_ops(llm.engine.runner.ops), prompts, params, adapters)
    for i, (a, b) in enumerate(zip(new, old)):
        assert a.error is None and b.error is None
        _finite_lps(a)
        _agree(a.outputs[0], b.outputs[0], f"text {i}")
        _prompt_lps_close(a, b, f"text {i}")


# ------------------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def server(demo_model_dir, adapters, tmp_path_factory):
    if not _kernels_here():
        pytest.skip("no AVX512-BF16 prompt kernels on this CPU")
    root = tmp_path_factory.mktemp("prompt-kernels-serve")
    toml = "[engine]\nkv_cache_memory_gb = 0.06\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ENGINE.items())
    proc = ServeProcess(root / "data", demo_model_dir, admin_key=ADMIN_KEY, config=toml, start_timeout=600)
    try:
        tid_a, key_a = new_tenant(proc.url, "pk-a")
        tid_b, key_b = new_tenant(proc.url, "pk-b")
        ids = {
            "r8": new_adapter(proc.url, "r8", tid_a, adapter_files(adapters["r8"])),
            "r16": new_adapter(proc.url, "r16", tid_a, adapter_files(adapters["r16"])),
            "r5": new_adapter(proc.url, "r5", tid_b, adapter_files(adapters["r5"])),
            "r12": new_adapter(proc.url, "r12", tid_b, adapter_files(adapters["r12"])),
        }
        yield proc, key_a, key_b, tid_b, ids
    finally:
        proc.kill()
    log = proc.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_a_servers_greedy_answers_by_token_ids_agree_with_the_in_process_engine(server, llm):
    """Over HTTP, one request at a time, prompts of 16-1000 tokens as token ids on each adapter and
    the base model: the server's greedy text and logprobs are the in-process new path's (up to
    near-ties); a stream carries the same text."""
    proc, key_a, key_b, _, _ = server
    base_id = next(m["id"] for m in httpx.get(proc.url + "/v1/models", headers=auth(key_a), timeout=60).json()["data"]
                   if m["id"] not in ("r8", "r16"))  # fmt: skip
    for n, adapter, key in ((16, "r8", key_a), (64, None, key_a), (129, "r16", key_a), (300, "r5", key_b),
                            (1000, "r12", key_b)):  # fmt: skip
        ids = _ids(n, 4000 + n)
        want = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0, logprobs=2), adapters=[adapter])[0]
        body = {"model": adapter or base_id, "prompt": ids, "max_tokens": 16, "temperature": 0, "logprobs": 2}
        status, text = fire(proc.url, key, "/v1/completions", body)
        assert status == 200, text[:500]
        (got,) = json.loads(text)["choices"]
        lps = got["logprobs"]["token_logprobs"]
        assert all(isinstance(v, float) and math.isfinite(v) for v in lps), lps
        want_tokens = [llm.tokenizer.decode([t]) for t in want.outputs[0].token_ids]
        k = next((i for i, (x, y) in enumerate(zip(got["logprobs"]["tokens"], want_tokens)) if x != y), len(lps))
        for x, y in zip(lps[:k], [lp.logprob for lp in want.outputs[0].logprobs[:k]]):
            assert abs(x - y) <= LP_TOL, (n, adapter, x, y)
        if k < len(lps):  # parted: only at a near-tie of the server's own top-2
            top = sorted(got["logprobs"]["top_logprobs"][k].values(), reverse=True)
            assert len(top) >= 2 and top[0] - top[1] <= TIE, (n, adapter, k, got["logprobs"]["top_logprobs"][k])
        status, streamed = fire(proc.url, key, "/v1/completions", {**body, "stream": True})
        assert status == 200
        # The stream is a prefix-cache hit (the native paged kernel for its last token): the same
        # tokens up to a near-tie of the first answer's top-2 (the demo model's logits are flat).
        chunks = [c for p in payloads(streamed, True) for c in p.get("choices", [])]
        tokens_s = [t for c in chunks for t in ((c.get("logprobs") or {}).get("tokens") or [])]
        assert "".join(c["text"] for c in chunks) == "".join(tokens_s), (n, adapter)
        tokens = got["logprobs"]["tokens"]
        k = next((i for i, (x, y) in enumerate(zip(tokens, tokens_s)) if x != y), None)
        if k is None:
            assert len(tokens_s) == len(tokens), (n, adapter)
        else:
            top = sorted(got["logprobs"]["top_logprobs"][k].values(), reverse=True)
            assert top[0] - top[1] <= TIE, (n, adapter, k, tokens[k], tokens_s[k], top)


def test_a_server_serves_a_hostile_mix_while_adapters_are_deleted_and_reuploaded(server, adapters):
    """48 concurrent requests of two tenants (prompts of 0 to ~1500 tokens, streams, n > 1, tools
    with auto/required, json_schema, top_logprobs, echo + prompt_logprobs, hostile strings) while
    r5 is deleted and uploaded again: every answer 200 (404/409 only for r5's requests), no 5xx,
    every 200 stream ends with [DONE], no non-finite logprob, json_schema answers parse; r5 answers
    again after the re-upload; no traceback in the log."""
    proc, key_a, key_b, tid_b, ids = server
    tool = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}  # fmt: skip
    words = "the quick brown fox jumps over a lazy dog and then "
    texts = ["", "\u0000", "x", "🤖" * 50, "<|endoftext|>" * 40, words * 3, words * 12, words * 60, "a" * 900,
             "日本語 \u202e\ud7ff" * 20, " " * 64, words * 6]  # fmt: skip
    crowd = []
    for i in range(48):
        key, model = [(key_a, "r8"), (key_b, "r5"), (key_a, "r16"), (key_b, "r12"), (key_a, "demo")][i % 5]
        text, kind = texts[i % len(texts)], (i // 5) % 6
        msgs = [{"role": "user", "content": text}]
        if kind == 0:
            body = ("/v1/completions", {"model": model, "prompt": text, "max_tokens": 1 + i % 9, "n": 3,
                                        "temperature": 0.8, "logprobs": 4, "seed": i})  # fmt: skip
        elif kind == 1:
            body = ("/v1/completions", {"model": model, "prompt": text or "x", "max_tokens": 20, "stream": True,
                                        "n": 2, "logprobs": 2})  # fmt: skip
        elif kind == 2:
            choice = ["auto", "required"][i % 2]
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 40, "tools": tool,
                                             "tool_choice": choice, "n": 2})  # fmt: skip
        elif kind == 3:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 60, "logprobs": True,
                    "top_logprobs": 3, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema}}})  # fmt: skip
        elif kind == 4:
            body = ("/v1/completions", {"model": model, "prompt": text or "x", "max_tokens": 6, "echo": True,
                                        "logprobs": 3, "prompt_logprobs": 2})  # fmt: skip
        else:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 24, "stream": True,
                    "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2})  # fmt: skip
        crowd.append((key, model, *body))
    with cf.ThreadPoolExecutor(12) as ex:
        futures = [ex.submit(fire, proc.url, key, path, body) for key, _, path, body in crowd]
        gone = httpx.delete(proc.url + f"/admin/v1/adapters/{ids['r5']}", headers=auth(ADMIN_KEY), timeout=60)
        again = new_adapter(proc.url, "r5", tid_b, adapter_files(adapters["r5"]))
        results = [f.result() for f in futures]
    assert gone.status_code == 200, gone.text
    ids["r5"] = again
    bad = []
    for (_, model, path, body), (code, text) in zip(crowd, results):
        allowed = {200, 404, 409} if model == "r5" else {200}
        if body["messages" if "messages" in body else "prompt"] in ("", [{"role": "user", "content": ""}]):
            allowed |= {400}  # an empty prompt may be refused (never a 5xx)
        info = (code, path, {k: v for k, v in body.items() if k not in ("prompt", "messages", "tools")}, text[:300])
        if code not in allowed:
            bad.append(info)
            continue
        if code != 200:
            continue
        events = payloads(text, bool(body.get("stream")))
        assert model == "r5" or not any("error" in p for p in events), info
        for where, v in (x for p in events for x in logprob_numbers(p)):
            assert math.isfinite(v), (where, v, info)
        if "response_format" in body:
            for choice in events[0]["choices"]:
                if choice["finish_reason"] == "stop":
                    parsed = json.loads(choice["message"]["content"])
                    assert set(parsed) >= {"a", "b"}, parsed
        if body.get("tool_choice") == "required":
            for choice in events[0]["choices"]:
                assert choice["finish_reason"] == "length" or choice["message"].get("tool_calls"), info
    assert not bad, bad[:5]
    assert sum(code == 200 for code, _ in results) >= 36
    status, text = fire(proc.url, key_b, "/v1/completions", {"model": "r5", "prompt": words * 20, "max_tokens": 4})
    assert status == 200, text[:300]


def test_a_server_at_max_model_len_answers_or_refuses_cleanly(server):
    """Prompts of 2000-2048 tokens (one whole-prompt kernel call of up to 32 work blocks per KV
    head) on an adapter and the base model: within max_model_len a 200 with finite logprobs (echo +
    prompt_logprobs included: they read every prompt position), past it a 400, never a 5xx."""
    proc, key_a, _, _, _ = server
    cases = [(2040, 8, 200), (2047, 1, 200), (2048, 1, 400), (2000, 60, 400)]
    for n, max_tokens, want in cases:
        for model in ("r16", "demo"):
            body = {"model": model, "prompt": _ids(n, n), "max_tokens": max_tokens, "temperature": 0, "logprobs": 2,
                    "echo": True, "prompt_logprobs": 1}  # fmt: skip
            status, text = fire(proc.url, key_a, "/v1/completions", body)
            assert status == want, (n, max_tokens, model, status, text[:300])
            if status == 200:
                numbers = logprob_numbers(json.loads(text))
                assert len(numbers) > n, (n, len(numbers))
                assert all(math.isfinite(v) for _, v in numbers), (n, model)
