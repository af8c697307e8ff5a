"""Hostile checks of commit 8298989 and its follow-ups, where they run by default: a bf16 engine on a
CPU with AVX512-BF16.

* ``kernels/csrc/cpu_prompt_attention.cpp`` (``cpu_native.paged_prefill_attention``): every prefill
  chunk of >= ``KERNEL_MIN_ROWS`` (16) rows goes to the vdpbf16ps prompt kernel, chunks OVER CACHED
  POSITIONS included (a chunked prompt's later chunks, the rest of a prompt after a prefix-cache hit,
  speculative verify rows of >= 16 tokens): row i of a chunk is position ``offset + i`` and sees keys
  0 .. offset + i. ``prompt_kernel=False`` is the old routing (SDPA for whole prompts >= 64, the native
  paged tile for the rest).
* ``engine/scheduler.py``: ``prefill_tokens_per_decode`` (``[engine]`` key, env
  ``LORAPLEX_ENGINE__PREFILL_TOKENS_PER_DECODE``): beside decodes a step's prompt tokens are bounded
  by ``prompt_room(decodes, waiting, per_decode)``.

Oracles: (1) the op alone on hostile shapes (offsets around the 16-key panels and 64-row items, block
sizes 1..32, MQA / no GQA, head dims 16..128, long prefixes): a float64 reference, the old routing,
and the kernel's own claim that a row's bits do not depend on the call or the threads; (2) a shadow of
the op inside real engines: EVERY call is recomputed by a float64 oracle, the old routing and the
chunk alone, and every chunk of >= 16 rows over cached positions must have reached the kernel with
the right offset (counted); (3) the engines' greedy tokens / logprobs / prompt logprobs under
prefill_tokens_per_decode in {0, 1, 3, 4, 1000, 10**9}, prefix-cache hits (suffixes of 1, 15, 16, 17,
100 tokens), n > 1, adapters of ranks 5 / 8 / 16 beside base rows and ngram speculation with 16
drafts, against the old routing and against prefill_tokens_per_decode = 0 (equal up to near-ties);
every step's prompt tokens within the room; (4) real ``loraplex serve`` processes: hostile values of
the setting refused at start with one error line naming it, a huge one served normally, and a
server at 4 answering a concurrent hostile mix (long prompts, streams, n = 2, json_schema, tools,
adapters, stop strings, max_tokens = 1, an adapter deleted and uploaded again under load) with no
5xx, every stream ending in [DONE], usage prompt_tokens = the tokenized prompt, no traceback.

Found (fixed since): ``test_the_room_holds_when_an_admission_preempts_decodes``: when an admission
preempted decoding sequences, their decode tokens went back to the step budget and the same pass
admitted them as prompt tokens past the room (``Scheduler._admit_waiting`` / ``_preempt_for``); the
room is now tracked apart from the budget, and every check here holds steps to the room exactly.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import json
import math
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from billing_helpers import auth, new_adapter, new_tenant
from harness.adapters import adapter_files, make_peft_adapter
from harness.serve import ServeProcess, serve_argv
from hostile_http_helpers import fire, logprob_numbers, payloads
from platform_helpers import ADMIN_KEY

from loraplex.engine import LLM, EngineRequest, OutputKind, SamplingParams
from loraplex.engine.scheduler import prompt_room
from loraplex.kernels import cpu_native, cpu_prompt_attention, cpu_sgmv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVERY = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ENGINE = {"dtype": "bfloat16", "max_num_seqs": 16, "max_loras": 4, "max_lora_rank": 16, "max_model_len": 2048}
MIN_ROWS = cpu_native.KERNEL_MIN_ROWS
LP_TOL = 0.05  # logprob agreement of two bf16 paths (as tests/platform/test_hostile_prompt_kernels.py)
TIE = 0.03  # two greedy runs may part only where the top-2 logprobs are this close


def _kernels_here() -> bool:
    return cpu_native.available() and cpu_native.prompt_kernel_isa() and cpu_sgmv.prompt_groups_available()


needs_kernels = pytest.mark.skipif(not _kernels_here(), reason="no AVX512-BF16 prompt kernels on this CPU")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The machine has 2 cores and shares them: at 2 threads every OpenMP barrier waits for a
    descheduled thread (10x slower). Tests that check the threads' independence ask for 2 locally."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 660, (n,), generator=g).tolist()


# -------------------------------------------------------------------------------- float64 oracle
def _oracle(q, k_cache, v_cache, block_tables, qsl, ctx, scale, seqs=None):
    """float64 attention: row i of sequence s sees positions < ctx[s] - qlen + i + 1 (NaN rows for
    the sequences not in ``seqs``)."""
    out = torch.full(q.shape, float("nan"), dtype=torch.float64)
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    hq = q.shape[1]
    for s in range(len(ctx)) if seqs is None else seqs:
        a, b, c = int(qsl[s]), int(qsl[s + 1]), int(ctx[s])
        if b == a:
            continue
        blocks = block_tables[s, : -(-c // bs)].long()
        k = k_cache[blocks].reshape(-1, hkv, d)[:c].double().repeat_interleave(hq // hkv, dim=1)
        v = v_cache[blocks].reshape(-1, hkv, d)[:c].double().repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("ihd,jhd->hij", q[a:b].double(), k) * scale
        pos = torch.arange(c - (b - a), c).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(c).unsqueeze(0) > pos, float("-inf"))
        out[a:b] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)
    return out


class KernelSpy:
    """Records each ``cpu_prompt_attention.attend`` call's chunks: (sequence, rows, offset)."""

    def __init__(self):
        self.calls: list[list[tuple[int, int, int]]] = []

    def __enter__(self):
        self.real = real = cpu_prompt_attention.attend

        def attend(q, out, k, v, bt, seqs, starts, lens, scale, *, lib, offsets=None):
            offs = list(offsets) if offsets is not None else [0] * len(seqs)
            self.calls.append(sorted(zip(seqs, lens, offs)))
            return real(q, out, k, v, bt, seqs, starts, lens, scale, lib=lib, offsets=offsets)

        cpu_prompt_attention.attend = attend
        return self

    def __exit__(self, *exc):
        cpu_prompt_attention.attend = self.real


def _expected_chunks(qsl, ctx) -> list[tuple[int, int, int]]:
    starts, lens = qsl.tolist(), ctx.tolist()
    return sorted(
        (s, starts[s + 1] - starts[s], c - (starts[s + 1] - starts[s]))
        for s, c in enumerate(lens)
        if starts[s + 1] - starts[s] >= MIN_ROWS
    )


def _rel_err(got, want) -> float:
    return float((got.double() - want).abs().max()) / max(float(want.abs().max()), 1e-30)


# ----------------------------------------------------------------------------- the op alone
def _paged(ctx, bs, hkv, d, seed, pad=-1):
    """A bf16 paged cache holding ``ctx`` keys per sequence in shuffled blocks; table padding ``pad``
    and a poisoned (NaN) free block nobody owns."""
    g = torch.Generator().manual_seed(seed)
    per = [-(-n // bs) for n in ctx]
    total = sum(per) + 3
    k_cache = torch.randn(total, bs, hkv, d, generator=g).bfloat16()
    v_cache = torch.randn(total, bs, hkv, d, generator=g).bfloat16()
    perm = torch.randperm(total, generator=g)
    tables = torch.full((len(ctx), max(per) + 3), pad, dtype=torch.int32)
    used = 0
    for s, n in enumerate(per):
        tables[s, :n] = perm[used : used + n].to(torch.int32)
        used += n
    k_cache[perm[used]] = float("nan")  # never read: a block of nobody's
    v_cache[perm[used]] = float("nan")
    # Stale NaN in the cache slots past each sequence's last key (a used pool): never read either.
    for s, n in enumerate(ctx):
        if n % bs:
            k_cache[tables[s, n // bs], n % bs :] = float("nan")
            v_cache[tables[s, n // bs], n % bs :] = float("nan")
    return k_cache, v_cache, tables


# (name, bs, hq, hkv, d, [(context length, chunk rows)])
OP_CASES = [
    # Offsets around the 16-key panels and 64-row items, chunks at the 16-row threshold, decode
    # rows and short chunks beside them (paged tile), whole prompts of < 64 (now the kernel's).
    (
        "gqa2-d32-bs16",
        16,
        4,
        2,
        32,
        [(17, 16), (32, 16), (31, 16), (80, 17), (81, 64), (129, 65), (200, 15), (77, 1), (40, 40), (20, 20), (16, 16)],
    ),
    # MQA, head dim 48 (3 panels), 1-token blocks (a table entry per key), a 1990-key prefix.
    ("mqa-d48-bs1", 1, 4, 1, 48, [(2000, 10), (2000, 64 + 1), (300, 128), (65, 33), (5, 1)]),
    # No GQA, head dim 128 (8 panels), 32-token blocks, chunks ending mid-block.
    ("mha-d128-bs32", 32, 2, 2, 128, [(1030, 129), (47, 31), (64, 48), (100, 99), (33, 17)]),
    # Head dim 16 (one panel), 8-token blocks, GQA 8:1.
    ("gqa8-d16-bs8", 8, 8, 1, 16, [(19, 18), (513, 200), (70, 16), (9, 9)]),
]


@needs_kernels
@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c[0])
def test_the_op_on_chunks_over_cached_positions_of_hostile_shapes(case):
    """One mixed call per shape: every chunk of >= 16 rows reaches the kernel once, with offset =
    context - rows; every row is within bf16 rounding of the float64 oracle and of the old routing;
    a chunk's rows have the same bits computed alone, at 2 threads and at 1; NaN in blocks and slots
    nobody may read never leaks into a row."""
    name, bs, hq, hkv, d, chunks = case
    ctx = [c for c, _ in chunks]
    qlens = [r for _, r in chunks]
    k_cache, v_cache, tables = _paged(ctx, bs, hkv, d, seed=len(name) + d)
    g = torch.Generator().manual_seed(d)
    qkv = torch.randn(sum(qlens), hq + 2 * hkv, d, generator=g).bfloat16()
    q = qkv[:, :hq]  # strided, as the engine passes it
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    ctx_t = torch.tensor(ctx, dtype=torch.int32)
    scale = d**-0.5
    assert cpu_native.prompt_kernel_applies(q)
    with KernelSpy() as spy:
        out = cpu_native.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale)
    assert spy.calls == [_expected_chunks(qsl, ctx_t)], spy.calls
    assert torch.isfinite(out).all(), "NaN from a block or slot no row may read"
    want = _oracle(q, k_cache, v_cache, tables, qsl, ctx_t, scale)
    with KernelSpy() as off:  # the switches keep every chunk off the kernel
        old = cpu_native.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale, prompt_kernel=False)
        tile = cpu_native.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale,
                                                  whole_prompt_sdpa=False)  # fmt: skip
    assert off.calls == [], off.calls
    assert torch.isfinite(old).all() and torch.isfinite(tile).all()
    starts = qsl.tolist()
    for s in range(len(ctx)):
        a, b = starts[s], starts[s + 1]
        what = f"{name}: chunk of {qlens[s]} rows over {ctx[s] - qlens[s]} cached keys"
        assert _rel_err(out[a:b], want[a:b]) <= 2**-6, (what, _rel_err(out[a:b], want[a:b]))
        assert _rel_err(out[a:b], old[a:b].double()) <= 2**-5, (what, "vs old routing")
        assert _rel_err(tile[a:b], want[a:b]) <= 2**-6, (what, "the paged tile vs float64")
        # Alone in its own call (another item order, other neighbours): the same bits.
        alone = cpu_native.paged_prefill_attention(
            q[a:b], k_cache, v_cache, tables[s : s + 1], torch.tensor([0, b - a], dtype=torch.int32), ctx_t[s : s + 1],
            scale,
        )  # fmt: skip
        assert torch.equal(alone, out[a:b]), (what, "bits changed alone")
    torch.set_num_threads(2)
    try:
        two = cpu_native.paged_prefill_attention(q, k_cache, v_cache, tables, qsl, ctx_t, scale)
    finally:
        torch.set_num_threads(1)
    assert torch.equal(two, out), "bits changed with the thread count"


# ------------------------------------------------------------------------------- the shadow
class Shadow:
    """Engine ops whose prefill attention is the new routing, each call checked on the engine's own
    tensors against the float64 oracle, the old routing (``prompt_kernel=False``) and each kernel
    chunk computed alone; counts the chunks over cached positions and whether they took the kernel."""

    def __init__(self, ops, applies: bool = True):
        self.ops = ops
        self.applies = applies  # False: the kernel must never run (float32, head dim not a multiple of 16)
        self.calls = 0
        self.offset_chunks = 0  # chunks of >= 16 rows over cached positions (kernel expected)
        self.offset_rows = 0
        self.short_offset_chunks = 0  # 2..15 rows over cached positions (paged tile expected)
        self.max_offset = 0
        self.chunk_shapes: set[tuple[int, int]] = set()  # (rows, offset)
        self.failures: list[str] = []

    def replaced(self):
        return dataclasses.replace(self.ops, paged_prefill_attention=self.attention)

    def attention(self, q, k_cache, v_cache, block_tables, qsl, ctx, scale):
        with KernelSpy() as spy:
            out = cpu_native.paged_prefill_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale)
        self.calls += 1
        expected = _expected_chunks(qsl, ctx) if self.applies else []
        got = [c for call in spy.calls for c in call]
        info = f"qlens {(qsl[1:] - qsl[:-1]).tolist()} ctx {ctx.tolist()}"
        if len(spy.calls) > 1 or got != expected:
            self.failures.append(f"routing: kernel got {got}, expected {expected} ({info})")
        starts = qsl.tolist()
        for _, rows, off in expected:
            if off > 0:
                self.offset_chunks += 1
                self.offset_rows += rows
                self.max_offset = max(self.max_offset, off)
                self.chunk_shapes.add((rows, off))
        for s, c in enumerate(ctx.tolist()):
            rows = starts[s + 1] - starts[s]
            if 1 < rows < MIN_ROWS and c > rows:
                self.short_offset_chunks += 1
        want = _oracle(q, k_cache, v_cache, block_tables, qsl, ctx, scale)
        old = cpu_native.paged_prefill_attention(q, k_cache, v_cache, block_tables, qsl, ctx, scale,
                                                 prompt_kernel=False)  # fmt: skip
        for s in range(len(starts) - 1):
            a, b = starts[s], starts[s + 1]
            if a == b:
                continue
            if not bool(torch.isfinite(out[a:b]).all()):
                # Overflowing scores (an adapter scaled past the dtype): the request fails on its
                # non-finite hidden state, as long as the kernel is not finite where the old path
                # was not either; finite inputs must stay finite wherever the old path stayed finite.
                if bool(torch.isfinite(old[a:b]).all()):
                    self.failures.append(f"seq {s}: non-finite where the old routing is finite ({info})")
                continue
            if bool(torch.isfinite(want[a:b]).all()):
                err = _rel_err(out[a:b], want[a:b])
                if not err <= 2**-6:
                    self.failures.append(f"seq {s} vs float64: {err:.4g} ({info})")
            if bool(torch.isfinite(old[a:b]).all()):
                err = _rel_err(out[a:b], old[a:b].double())
                if not err <= 2**-5:
                    self.failures.append(f"seq {s} vs old routing: {err:.4g} ({info})")
        for s, rows, off in expected:
            a, b = starts[s], starts[s + 1]
            alone = cpu_native.paged_prefill_attention(
                q[a:b], k_cache, v_cache, block_tables[s : s + 1], torch.tensor([0, rows], dtype=torch.int32),
                ctx[s : s + 1], scale,
            )  # fmt: skip
            if not _same_bits(alone, out[a:b]):
                self.failures.append(f"seq {s} ({rows} rows at {off}): bits differ alone ({info})")
        return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN payloads included)."""
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def old_ops(ops):
    return dataclasses.replace(
        ops, paged_prefill_attention=functools.partial(ops.paged_prefill_attention, prompt_kernel=False)
    )


def _finite_lps(out) -> None:
    for c in out.outputs:
        for lp in c.logprobs or []:
            assert math.isfinite(lp.logprob), (out.request_id, lp)
    for lp in out.prompt_logprobs or []:
        assert math.isfinite(lp.logprob), (out.request_id, lp)


def _agree(a, b, what: str) -> int:
    """Two greedy completions: equal tokens up to a near-tie, logprobs within LP_TOL before it."""
    ta, tb = a.token_ids, b.token_ids
    n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    for i in range(n):
        la, lb = a.logprobs[i].logprob, b.logprobs[i].logprob
        assert abs(la - lb) <= LP_TOL, (what, i, la, lb)
    if n < min(len(ta), len(tb)):
        # A near-tie seen from either side (a top-2 list may hold two exactly tied tokens and leave
        # out the other run's choice): one run's token is in the other's top within TIE.
        top_a, top_b = dict(a.logprobs[n].top), dict(b.logprobs[n].top)
        margins = [top_a[ta[n]] - top_a[tb[n]]] if tb[n] in top_a else []
        margins += [top_b[tb[n]] - top_b[ta[n]]] if ta[n] in top_b else []
        assert margins, (what, n, "neither token in the other's top", a.logprobs[n], b.logprobs[n])
        assert min(margins) <= TIE, (what, n, "parted at a clear winner", margins, a.logprobs[n], b.logprobs[n])
    else:
        assert len(ta) == len(tb), (what, len(ta), len(tb))
    return n


def _prompt_lps_close(a, b, what: str) -> float:
    pa, pb = a.prompt_logprobs, b.prompt_logprobs
    assert pa is not None and pb is not None and len(pa) == len(pb), (what, pa and len(pa), pb and len(pb))
    worst = 0.0
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert x.token_id == y.token_id, (what, i)
        worst = max(worst, abs(x.logprob - y.logprob))
        assert abs(x.logprob - y.logprob) <= LP_TOL, (what, i, x, y)
    return worst


# ----------------------------------------------------------------------------- engines
@pytest.fixture(scope="module")
def adapters(demo_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prompt-chunk-adapters")
    return {
        "r8": make_peft_adapter(demo_model_dir, root / "r8", r=8, alpha=16, targets=EVERY, seed=1),
        "r16": make_peft_adapter(demo_model_dir, root / "r16", r=16, alpha=32, targets=EVERY, seed=2),
        "r5": make_peft_adapter(demo_model_dir, root / "r5", r=5, alpha=10, targets=("q_proj", "v_proj"), seed=3),
    }


def _engine(model_dir: Path, adapters: dict[str, Path] | None, **kw) -> LLM:
    if not _kernels_here():
        pytest.skip("no AVX512-BF16 prompt kernels on this CPU")
    llm = LLM(model=str(model_dir), **{**ENGINE, **kw})
    if llm.engine.runner.ops.name not in ("cpu", "cpu+batch_invariant") or cpu_native._lib is None:
        pytest.skip("the native CPU kernels are not built here")
    for name, path in (adapters or {}).items():
        llm.add_adapter(name, str(path))
    return llm


class Plans:
    """Every step's plan: (sequences decoding and requests waiting when it starts, its prompt chunk
    sizes)."""

    def __init__(self, llm: LLM):
        self.steps: list[tuple[int, list[int], int]] = []
        self.decode_victims: list[int] = []  # per step: decoding sequences the plan preempted
        sched = llm.engine.scheduler
        real = sched.schedule

        def spy():
            # The room is sized by the decodes and the waiting requests when the plan starts (a
            # sequence the plan preempts moves from one to the other).
            waiting = sched.policy.num_waiting()
            decoding = {s.seq_id for s in sched.running if s.in_decode}
            plan = real()
            self.steps.append((len(decoding), [c.num_tokens for c in plan.chunks if not c.seq.in_decode], waiting))
            self.decode_victims.append(sum(1 for s in plan.preempted if s.seq_id in decoding))
            return plan

        sched.schedule = spy


def _waves(llm: LLM, ops, waves: list[list], steps_between: int = 3) -> list:
    """Each wave of (prompt, params, adapter) requests joins the engine ``steps_between`` steps
    after the previous one (the later ones join running decodes); every output, in order."""
    plain = llm.engine.runner.ops
    llm.engine.runner.ops = ops
    try:
        ids: list[str] = []
        done: dict[str, object] = {}

        def step():
            for out in llm.engine.step():
                if out.finished:
                    done[out.request_id] = out

        for w, wave in enumerate(waves):
            for prompt, params, adapter in wave:
                req = EngineRequest(prompt, params, adapter=adapter, output_kind=OutputKind.FINAL_ONLY)
                ids.append(llm.engine.add_request(req).request_id)
            if w + 1 < len(waves):
                for _ in range(steps_between):
                    step()
        for _ in range(20000):
            if len(done) == len(ids):
                break
            step()
        assert len(done) == len(ids), "the engine did not finish every request"
        return [done[i] for i in ids]
    finally:
        llm.engine.runner.ops = plain


GREEDY = dict(temperature=0, ignore_eos=True, logprobs=2)
PREFIX = _ids(256, 4242)  # 16 full blocks
SUFFIXES = (1, 15, 16, 17, 100)


def _workload() -> list[list]:
    """Wave 1: short prompts that decode for a while (base and adapters) and the shared prefix on
    r8 (to be cached). Wave 2, joining the decodes: long prompts (chunked: 200..1500 tokens, one
    with prompt logprobs, one n = 2), and the prefix + suffixes of 1, 15, 16, 17, 100 tokens on r8
    (prefix-cache hits: the rest of the prompt over 256 cached keys)."""
    decoding = [
        (_ids(5 + i, 200 + i), SamplingParams(max_tokens=40 + 30 * i, **GREEDY), [None, "r8", "r16", "r5"][i % 4])
        for i in range(6)
    ]
    decoding.append((PREFIX + [7], SamplingParams(max_tokens=2, **GREEDY), "r8"))
    joining = [
        (_ids(200, 301), SamplingParams(max_tokens=6, **GREEDY), None),
        (_ids(333, 302), SamplingParams(max_tokens=6, **GREEDY), "r16"),
        (_ids(700, 303), SamplingParams(max_tokens=4, prompt_logprobs=1, **GREEDY), "r5"),
        (_ids(1500, 304), SamplingParams(max_tokens=4, **GREEDY), None),
        (_ids(129, 305), SamplingParams(max_tokens=6, n=2, **GREEDY), "r8"),
    ]
    hits = [(PREFIX + _ids(k, 400 + k), SamplingParams(max_tokens=5, **GREEDY), "r8") for k in SUFFIXES]
    return [decoding, [], joining + hits]


def _check_plans(plans: Plans, per_decode: int) -> int:
    """Every step that carries decodes adds at most the room's prompt tokens; returns how many
    steps cut prompts beside decodes."""
    beside = 0
    for (decodes, chunks, waiting), victims in zip(plans.steps, plans.decode_victims):
        room = prompt_room(decodes, waiting, per_decode)
        if decodes and chunks:
            beside += 1
            if room is not None:
                assert sum(chunks) <= room, (decodes, chunks, waiting, room, victims)
    return beside


@pytest.fixture(scope="module")
def reference_outputs(demo_model_dir, adapters):
    """The workload under the old routing with the room off (what ran before these commits)."""
    llm = _engine(demo_model_dir, adapters, num_kv_blocks=600, prefill_tokens_per_decode=0)
    return _waves(llm, old_ops(llm.engine.runner.ops), _workload())


def _compare(outs, ref, what: str) -> None:
    work = [r for wave in _workload() for r in wave]
    assert len(outs) == len(ref) == len(work)
    for i, ((prompt, params, adapter), a, b) in enumerate(zip(work, outs, ref)):
        assert a.error is None and b.error is None, (what, i, a.error, b.error)
        _finite_lps(a)
        assert len(a.outputs) == params.n
        tag = f"{what}: request {i} ({len(prompt)} tokens, adapter {adapter})"
        for ca, cb in zip(a.outputs, b.outputs):
            _agree(ca, cb, tag)
        if params.prompt_logprobs is not None:
            _prompt_lps_close(a, b, tag + " prompt logprobs")


@needs_kernels
@pytest.mark.parametrize("per_decode", [0, 1, 3, 4, 1000, 10**9])
def test_every_call_of_a_chunked_workload_matches_the_oracles(per_decode, demo_model_dir, adapters,
                                                               reference_outputs):  # fmt: skip
    """The shadow on the workload at a room of ``per_decode``: no failure; chunks over cached
    positions of >= 16 rows ran (counted, offsets up to the 1500-token prompt's) and every one
    took the kernel; every step within the room; prefix hits of >= 256 tokens; greedy tokens,
    logprobs and the chunked prompt's prompt logprobs agree with the old routing without a room."""
    llm = _engine(demo_model_dir, adapters, num_kv_blocks=600, prefill_tokens_per_decode=per_decode)
    plans = Plans(llm)
    shadow = Shadow(llm.engine.runner.ops)
    outs = _waves(llm, shadow.replaced(), _workload())
    assert not shadow.failures, shadow.failures[:8]
    assert shadow.offset_chunks >= 20, (shadow.offset_chunks, sorted(shadow.chunk_shapes))
    assert shadow.max_offset >= 1000, shadow.max_offset
    if per_decode >= 1000:  # the room never cuts: the prefix hits' 16- and 17-token rests are whole chunks
        assert {(16, 256), (17, 256)} <= shadow.chunk_shapes, sorted(shadow.chunk_shapes)
    assert any(off >= 256 for rows, off in shadow.chunk_shapes), sorted(shadow.chunk_shapes)
    beside = _check_plans(plans, per_decode)
    assert beside > 0, plans.steps[:10]
    hits = outs[-len(SUFFIXES) :]
    assert all(o.metrics["num_cached_tokens"] >= 256 for o in hits), [o.metrics for o in hits]
    _compare(outs, reference_outputs, f"room {per_decode}")
    print(f"room {per_decode}: {shadow.calls} calls, {shadow.offset_chunks} offset chunks, {len(plans.steps)} steps")


@needs_kernels
def test_a_chunked_prompts_prompt_logprobs_match_it_computed_whole(demo_model_dir, adapters):
    """A 900-token prompt asking for prompt logprobs joins 8 streams at a room of 3 (chunks of
    32..64 rows over up to ~870 cached positions, on the kernel); its prompt logprobs and greedy
    tokens match the same prompt computed whole in an idle engine (one whole-prompt call) under
    the old routing (SDPA) and the new one."""
    prompt = _ids(900, 77)
    params = SamplingParams(max_tokens=6, prompt_logprobs=2, **GREEDY)
    for adapter in (None, "r16"):
        llm = _engine(demo_model_dir, adapters, num_kv_blocks=400, prefill_tokens_per_decode=3)
        plans = Plans(llm)
        shadow = Shadow(llm.engine.runner.ops)
        streams = [(_ids(6, 50 + i), SamplingParams(max_tokens=120, **GREEDY), ["r8", None][i % 2]) for i in range(8)]
        chunked = _waves(llm, shadow.replaced(), [streams, [(prompt, params, adapter)]], steps_between=2)[-1]
        assert not shadow.failures, shadow.failures[:8]
        cuts = [c for d, chunks, _ in plans.steps if d for c in chunks]
        assert len(cuts) >= 10 and max(cuts) <= 64, cuts  # the prompt really went in room-sized chunks
        assert shadow.offset_chunks >= 10, sorted(shadow.chunk_shapes)
        idle = _engine(demo_model_dir, adapters, num_kv_blocks=400)
        whole_old = _waves(idle, old_ops(idle.engine.runner.ops), [[(prompt, params, adapter)]])[0]
        whole_new = idle.generate([prompt], params, adapters=[adapter])[0]
        for whole, what in ((whole_old, "SDPA whole"), (whole_new, "kernel whole")):
            assert chunked.error is None and whole.error is None
            _finite_lps(chunked)
            assert len(chunked.prompt_logprobs) == len(prompt) - 1
            _prompt_lps_close(chunked, whole, f"{adapter}: chunked vs {what}")
            _agree(chunked.outputs[0], whole.outputs[0], f"{adapter}: chunked vs {what}")


@needs_kernels
def test_prefix_hits_with_forks_and_prompt_logprobs(demo_model_dir, adapters):
    """With a 256-token prefix cached on r16: prefix + 16 / 17 / 100 tokens with n = 3 greedy forks
    (the rest over 256 cached keys on the kernel, then copy-on-write forks) give three equal answers
    that agree with an engine without a prefix cache; the same prompt asking for prompt logprobs
    bypasses the cache (it needs every position's logits: no cached tokens) and its prompt
    logprobs match the no-cache engine's."""
    pc = _engine(demo_model_dir, adapters, num_kv_blocks=400, prefill_tokens_per_decode=3)
    nc = _engine(demo_model_dir, adapters, num_kv_blocks=400, enable_prefix_caching=False)
    shadow = Shadow(pc.engine.runner.ops)
    pc.engine.runner.ops = shadow.replaced()
    assert pc.generate([PREFIX + [9]], SamplingParams(max_tokens=1, **GREEDY), adapters=["r16"])[0].error is None
    forks = SamplingParams(max_tokens=8, n=3, **GREEDY)
    lps = SamplingParams(max_tokens=4, prompt_logprobs=1, **GREEDY)
    for k in (16, 17, 100):
        prompt = PREFIX + _ids(k, 600 + k)
        hit, plp = pc.generate([prompt, prompt], [forks, lps], adapters=["r16", "r16"])
        want, want_plp = nc.generate([prompt, prompt], [forks, lps], adapters=["r16", "r16"])
        assert hit.error is None and plp.error is None, (hit.error, plp.error)
        assert hit.metrics["num_cached_tokens"] == 256, hit.metrics
        assert plp.metrics["num_cached_tokens"] == 0, plp.metrics
        assert len({tuple(c.token_ids) for c in hit.outputs}) == 1, [c.token_ids for c in hit.outputs]
        _agree(hit.outputs[0], want.outputs[0], f"suffix {k}: hit vs no cache")
        _prompt_lps_close(plp, want_plp, f"suffix {k}: prompt logprobs")
    assert not shadow.failures, shadow.failures[:8]
    assert {(16, 256), (17, 256), (100, 256)} <= shadow.chunk_shapes, sorted(shadow.chunk_shapes)


# Periods of 20 and 24 tokens: the n-gram proposer finds the last 4 tokens one period back and
# proposes the 16 that followed (a shorter period would cap its proposals at the period).
SPEC_PROMPTS = [_ids(20, 1) * 10, _ids(24, 2) * 8 + _ids(40, 3), _ids(300, 4), _ids(20, 5) * 30]


def _agree_tokens(got, ref, what: str) -> None:
    """``got``'s greedy tokens (no logprobs: speculation skips those requests) against ``ref``'s
    (with logprobs): equal up to a near-tie of ``ref``'s top-2 where they part."""
    tg, tr = got.token_ids, ref.token_ids
    n = next((i for i, (x, y) in enumerate(zip(tg, tr)) if x != y), None)
    if n is None:
        assert len(tg) == len(tr), (what, len(tg), len(tr))
        return
    top = dict(ref.logprobs[n].top)
    assert tg[n] in top, (what, n, "not in the reference's top", tg[n], ref.logprobs[n])
    assert top[tr[n]] - top[tg[n]] <= TIE, (what, n, "parted at a clear winner", ref.logprobs[n])


@needs_kernels
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_verify_rows_of_seventeen_tokens_take_the_kernel_and_agree(method, demo_model_dir, adapters):
    """num_speculative_tokens = 16 (the maximum): a decode verifying 16 drafts is a 17-row chunk over
    its cached positions, so it goes to the kernel; with the room at 4, periodic prompts (the n-gram
    proposer's full 16 drafts) beside a random one, on base rows and adapters (r8, r16). With
    ``draft`` (self-speculation on the target's first 2 layers) the draft runner's own calls are
    shadowed too. Greedy tokens agree with the same engine without speculation (up to near-ties)."""
    extra = {"draft_model": str(demo_model_dir), "draft_num_layers": 2} if method == "draft" else {}
    spec = _engine(demo_model_dir, adapters, num_kv_blocks=500, prefill_tokens_per_decode=4,
                   speculative_method=method, num_speculative_tokens=16, speculative_adaptive=False,
                   **extra)  # fmt: skip
    shadow = Shadow(spec.engine.runner.ops)
    draft_shadow = None
    if method == "draft":
        draft_runner = spec.engine.spec.draft.runner
        draft_shadow = Shadow(draft_runner.ops)
        draft_runner.ops = draft_shadow.replaced()
    adapters_of = [None, "r8", None, "r16"]
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    first = [(p, params, a) for p, a in zip(SPEC_PROMPTS[:2], adapters_of[:2])]
    later = [(p, params, a) for p, a in zip(SPEC_PROMPTS[2:], adapters_of[2:])]
    outs = _waves(spec, shadow.replaced(), [first, later], steps_between=4)
    assert not shadow.failures, shadow.failures[:8]
    assert draft_shadow is None or not draft_shadow.failures, draft_shadow.failures[:8]
    verify = {s for s in shadow.chunk_shapes if s[0] == 1 + 16}
    assert verify, ("no 17-row verify chunk reached the kernel", sorted(shadow.chunk_shapes))
    stats = spec.engine.spec.stats()
    assert stats["accepted_tokens"] > 0, stats
    plain = _engine(demo_model_dir, adapters, num_kv_blocks=500, prefill_tokens_per_decode=4)
    with_lps = dataclasses.replace(params, logprobs=2)
    ref = _waves(plain, plain.engine.runner.ops, [[(p, with_lps, a) for p, _, a in first],
                                                  [(p, with_lps, a) for p, _, a in later]], steps_between=4)  # fmt: skip
    for i, (a, b) in enumerate(zip(outs, ref)):
        assert a.error is None and b.error is None, (a.error, b.error)
        _agree_tokens(a.outputs[0], b.outputs[0], f"{method}: prompt {i}")
    print(method, stats, sorted(verify)[:10], draft_shadow and sorted(draft_shadow.chunk_shapes)[:20])


@needs_kernels
def test_batch_invariant_rows_keep_their_bits_when_the_room_chunks_them(demo_model_dir, adapters):
    """``batch_invariant`` (the paged tile for every row) promises a row's bits whatever its batch
    and chunking: a seeded n = 2 request on r16 with a 300-token prompt is bit-identical alone and
    when it joins 10 streams at a room of 1 (cut into 32-token chunks); the kernel never runs."""
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, n=2, ignore_eos=True, logprobs=3,
                            prompt_logprobs=1)  # fmt: skip
    prompt = _ids(300, 31)

    def digest(o):
        return (
            [(c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs]) for c in o.outputs],
            [(lp.token_id, lp.logprob) for lp in o.prompt_logprobs or []],
        )

    with KernelSpy() as spy:
        inv = _engine(demo_model_dir, adapters, batch_invariant=True, num_kv_blocks=400, prefill_tokens_per_decode=1)
        plans = Plans(inv)
        alone = inv.generate([prompt], params, adapters=["r16"])[0]
        streams = [(_ids(4, 60 + i), SamplingParams(max_tokens=80, **GREEDY), [None, "r8"][i % 2]) for i in range(10)]
        joined = _waves(inv, inv.engine.runner.ops, [streams, [(prompt, params, "r16")]], steps_between=2)[-1]
    assert spy.calls == []
    assert any(d and chunks for d, chunks, _ in plans.steps)
    assert digest(joined) == digest(alone)


@needs_kernels
@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_preempted_sequences_recompute_over_cached_positions_within_the_room(batching, demo_model_dir, adapters):
    """A KV pool too small for the load (preemptions: victims recompute prompt + output, as chunks
    over their cached prefix when the prefix cache still holds it) at a room of 3, continuous and
    static batching: the shadow holds, every step within the room, every request finishes with its
    greedy answer of an engine with a pool large enough (up to near-ties)."""
    work = [(_ids(n, 700 + n), SamplingParams(max_tokens=80, **GREEDY), [None, "r8", "r16", "r5"][i % 4])
            for i, n in enumerate((150, 300, 90, 420, 64, 200, 33, 250))]  # fmt: skip
    small = _engine(demo_model_dir, adapters, num_kv_blocks=70, prefill_tokens_per_decode=3, batching=batching)
    plans = Plans(small)
    shadow = Shadow(small.engine.runner.ops)
    outs = _waves(small, shadow.replaced(), [work[:4], work[4:]], steps_between=3)
    assert not shadow.failures, shadow.failures[:8]
    assert small.engine.counters["preemptions"] > 0, "the pool was meant to force preemptions"
    _check_plans(plans, 3)
    big = _engine(demo_model_dir, adapters, num_kv_blocks=600)
    ref = _waves(big, old_ops(big.engine.runner.ops), [work[:4], work[4:]], steps_between=3)
    for i, (a, b) in enumerate(zip(outs, ref)):
        assert a.error is None and b.error is None, (a.error, b.error)
        _finite_lps(a)
        _agree(a.outputs[0], b.outputs[0], f"{batching}: request {i}")
    print(batching, small.engine.counters, shadow.offset_chunks, sorted(shadow.chunk_shapes)[:30])


@needs_kernels
def test_a_prompt_aborted_mid_prefill_comes_back_as_a_prefix_hit_with_the_same_answer(demo_model_dir, adapters):
    """A 1000-token prompt on r16 joins 6 streams at a room of 1 (32-token chunks) and is aborted
    after a few chunks: its full blocks stay in the prefix cache, so the same prompt sent again
    starts from them (a rest of ~900 tokens over the cached keys, chunked again on the kernel). Its
    greedy answer is the idle engine's (old routing, whole prompt), and the shadow holds."""
    llm = _engine(demo_model_dir, adapters, num_kv_blocks=400, prefill_tokens_per_decode=1)
    shadow = Shadow(llm.engine.runner.ops)
    llm.engine.runner.ops = shadow.replaced()
    prompt = _ids(1000, 555)
    params = SamplingParams(max_tokens=8, **GREEDY)
    for i in range(6):
        llm.engine.add_request(EngineRequest(_ids(5, 80 + i), SamplingParams(max_tokens=200, **GREEDY),
                                             output_kind=OutputKind.FINAL_ONLY))  # fmt: skip
    for _ in range(2):
        llm.engine.step()
    doomed = llm.engine.add_request(EngineRequest(prompt, params, adapter="r16", output_kind=OutputKind.FINAL_ONLY))
    for _ in range(5):
        llm.engine.step()
    seq = doomed.sequences[0]
    assert 64 <= seq.num_computed_tokens < 1000, seq.num_computed_tokens
    llm.engine.abort_request(doomed.request_id)
    again = llm.engine.add_request(EngineRequest(prompt, params, adapter="r16", output_kind=OutputKind.FINAL_ONLY))
    done = {}
    for _ in range(5000):
        for out in llm.engine.step():
            if out.finished:
                done[out.request_id] = out
        if again.request_id in done:
            break
    got = done[again.request_id]
    assert got.error is None, got.error
    assert got.metrics["num_cached_tokens"] >= 64, got.metrics
    assert not shadow.failures, shadow.failures[:8]
    assert any(off >= 64 for _, off in shadow.chunk_shapes), sorted(shadow.chunk_shapes)
    idle = _engine(demo_model_dir, adapters, num_kv_blocks=400, enable_prefix_caching=False)
    want = _waves(idle, old_ops(idle.engine.runner.ops), [[(prompt, params, "r16")]])[0]
    _agree(got.outputs[0], want.outputs[0], "aborted then resent vs whole")


@needs_kernels
def test_an_overflowing_adapter_on_a_chunked_prompt_fails_alone(demo_model_dir, adapters, tmp_path):
    """An adapter whose q/k LoRA B is scaled 1e33 on a 600-token prompt cut into room-sized chunks
    beside streams (its NaN / inf keys land in the cache chunk by chunk, read by its later chunks on
    the kernel): the request fails with the engine's 'not finite' error and no tokens; base and r8
    prompts chunked in the same steps answer as they do without it (up to near-ties)."""
    import shutil

    from safetensors.torch import load_file, save_file

    huge = tmp_path / "huge"
    shutil.copytree(adapters["r8"], huge)
    f = huge / "adapter_model.safetensors"
    save_file({k: v * (1e33 if "lora_B" in k and ("q_proj" in k or "k_proj" in k) else 1.0)
               for k, v in load_file(str(f)).items()}, str(f))  # fmt: skip
    streams = [(_ids(5, 90 + i), SamplingParams(max_tokens=150, **GREEDY), [None, "r8"][i % 2]) for i in range(6)]
    params = SamplingParams(max_tokens=6, **GREEDY)
    joining = [(_ids(600, 1), params, "huge"), (_ids(500, 2), params, None), (_ids(400, 3), params, "r8")]
    outs = {}
    for with_huge in (True, False):
        llm = _engine(demo_model_dir, {**adapters, "huge": huge}, num_kv_blocks=400, prefill_tokens_per_decode=2)
        shadow = Shadow(llm.engine.runner.ops)
        wave = joining if with_huge else joining[1:]
        outs[with_huge] = _waves(llm, shadow.replaced(), [streams, wave], steps_between=2)
        assert shadow.offset_chunks >= 10 and not shadow.failures, shadow.failures[:8]
    bad = outs[True][len(streams)]
    assert bad.error is not None and "not finite" in bad.error, (bad.error, bad.outputs[0].token_ids)
    assert bad.outputs[0].token_ids == []
    for a, b in zip(outs[True][: len(streams)] + outs[True][len(streams) + 1 :], outs[False]):
        assert a.error is None and b.error is None
        _finite_lps(a)
        _agree(a.outputs[0], b.outputs[0], "a neighbour of the overflowing adapter")


@needs_kernels
def test_the_room_holds_when_an_admission_preempts_decodes(demo_model_dir):
    """The room bounds a step's prompt tokens by the decodes and waiting requests at the plan's
    start (prompt_room). Here tenant a's 16 short streams fill a tight KV pool (24 blocks of 8) and
    tenant b's four 150-token prompts arrive: under ``fair`` b is below its share, so its first
    admission preempts several of a's decodes for their blocks. Each victim's scheduled decode
    token goes back to the step's budget (``Scheduler._preempt_for``), and the next admission of
    the same pass spends it as prompt tokens: the step carries room + (decode victims) prompt
    tokens (measured: 64 + 4 = 68 where the room is 64). Every step must stay within its room."""
    llm = _engine(demo_model_dir, None, num_kv_blocks=24, block_size=8, max_num_seqs=48, prefill_tokens_per_decode=4,
                  scheduling_policy="fair", enable_prefix_caching=False, watermark=0.0)  # fmt: skip
    ticks = iter(range(10**6))
    llm.engine.scheduler.clock = lambda: float(next(ticks))  # a virtual clock: the plans do not depend on timing
    plans = Plans(llm)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    for i in range(16):
        llm.engine.add_request(EngineRequest(_ids(3, i), params, tenant_id="a", output_kind=OutputKind.FINAL_ONLY))
    for _ in range(5):
        llm.engine.step()
    for i in range(4):
        llm.engine.add_request(EngineRequest(_ids(150, 50 + i), params, tenant_id="b",
                                             output_kind=OutputKind.FINAL_ONLY))  # fmt: skip
    for _ in range(5000):
        if not llm.engine.has_unfinished_requests():
            break
        llm.engine.step()
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.scheduler.admission_preemption.preemptions > 0, "meant to make b's admission preempt a"
    over = [(d, w, chunks, prompt_room(d, w, 4)) for d, chunks, w in plans.steps
            if d and chunks and sum(chunks) > prompt_room(d, w, 4)]  # fmt: skip
    assert not over, f"steps past their room (decodes, waiting, prompt chunks, room): {over}"


# (arch, checkpoint overrides, engine settings, whether the prompt kernel applies)
SHAPES = {
    # Qwen2 (q/k/v bias), head dim 80 (5 panels), 32-token blocks: chunks over cached positions on
    # the kernel, offsets mid-block.
    "qwen2-d80-bs32": ("qwen2", {"hidden_size": 160, "num_attention_heads": 2, "num_key_value_heads": 2},
                       {"block_size": 32}, True),
    # MQA, head dim 48, 8-token blocks, int8 weights beside bf16 activations.
    "llama-mqa-d48-bs8-int8": ("llama", {"hidden_size": 192, "num_attention_heads": 4, "num_key_value_heads": 1},
                               {"block_size": 8, "quantization": "int8"}, True),
    # Head dim 24 (not a multiple of 16): every chunk stays on the old routing.
    "llama-d24": ("llama", {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}, {}, False),
    # float32: the kernel is bf16 only.
    "demo-float32": ("llama", {}, {"dtype": "float32"}, False),
}  # fmt: skip


@needs_kernels
@pytest.mark.parametrize("shape", list(SHAPES))
def test_chunks_on_other_model_shapes_take_the_documented_path(shape, tmp_path):
    """Other checkpoints at a room of 1 with prompts of 100-900 tokens joining streams: where the
    kernel applies every chunk of >= 16 rows over cached positions takes it (the shadow holds);
    where it does not (head dim 24, float32) it never runs; greedy answers agree with the old
    routing (same engine settings) up to near-ties."""
    from loraplex.engine.demo_model import create_random_checkpoint

    arch, overrides, settings, applies = SHAPES[shape]
    model = create_random_checkpoint(tmp_path / "model", arch=arch, seed=7, **overrides)
    ad = make_peft_adapter(model, tmp_path / "a8", r=8, alpha=16, targets=EVERY, seed=1)
    waves = [
        [(_ids(4, 10 + i), SamplingParams(max_tokens=100, **GREEDY), [None, "a8"][i % 2]) for i in range(5)],
        [(_ids(n, n), SamplingParams(max_tokens=5, **GREEDY), [None, "a8"][i % 2])
         for i, n in enumerate((100, 333, 900, 64))],
    ]  # fmt: skip
    llm = _engine(model, {"a8": ad}, num_kv_blocks=300, prefill_tokens_per_decode=1, **settings)
    shadow = Shadow(llm.engine.runner.ops, applies=applies)
    with KernelSpy() as spy:
        outs = _waves(llm, shadow.replaced(), waves, steps_between=2)
    assert not shadow.failures, shadow.failures[:8]
    if applies:
        assert shadow.offset_chunks >= 10, sorted(shadow.chunk_shapes)
    else:
        assert spy.calls == [], spy.calls[:5]
    ref_llm = _engine(model, {"a8": ad}, num_kv_blocks=300, **settings)
    ref = _waves(ref_llm, old_ops(ref_llm.engine.runner.ops), waves, steps_between=2)
    for i, (a, b) in enumerate(zip(outs, ref)):
        assert a.error is None and b.error is None, (a.error, b.error)
        _finite_lps(a)
        _agree(a.outputs[0], b.outputs[0], f"{shape}: request {i}")


# ------------------------------------------------------------------------------ real servers
@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("env", "-1", ">= 0"),
        ("env", "abc", "valid integer"),
        ("env", "true", "valid integer"),
        ("env", "1.5", "valid integer"),
        ("toml", "-1", ">= 0"),
        ("toml", '"abc"', "valid integer"),
        ("toml", "true", "not a boolean"),
        ("toml", "1.5", "fractional part"),
    ],
)
def test_a_hostile_room_setting_is_one_clear_error_at_start(tmp_path, demo_model_dir, where, value, says):
    """``loraplex serve`` with a bad prefill_tokens_per_decode (environment or config file): exit
    code 2, one ``error:`` header and one line naming the setting and what is wrong, no traceback,
    nothing served."""
    env = {**os.environ, "LORAPLEX_ENGINE__MODEL": str(demo_model_dir)}
    env.pop("LORAPLEX_ENGINE__PREFILL_TOKENS_PER_DECODE", None)
    args: list[str] = []
    if where == "env":
        env["LORAPLEX_ENGINE__PREFILL_TOKENS_PER_DECODE"] = value
    else:
        config = tmp_path / "serve.toml"
        config.write_text(f"[engine]\nprefill_tokens_per_decode = {value}\n")
        args = ["--config", str(config)]
    proc = subprocess.run(serve_argv(tmp_path / "data", 0, *args), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    named = [line for line in proc.stderr.splitlines() if "prefill_tokens_per_decode" in line]
    assert len(errors) == 1 and len(named) == 1 and says in named[0], proc.stderr[-3000:]
    assert "Uvicorn running" not in proc.stderr + proc.stdout


WORDS = "the quick brown fox jumps over a lazy dog and then "
SERVER_TOML = "[engine]\nkv_cache_memory_gb = 0.08\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ENGINE.items())


def _start(root: Path, demo_model_dir, adapters, *, env: dict, toml: str = SERVER_TOML) -> tuple:
    # One thread: the machine's 2 cores are shared (an OpenMP barrier at 2 threads waits for a
    # descheduled thread); the kernels' arithmetic does not depend on the thread count.
    proc = ServeProcess(root / "data", demo_model_dir, admin_key=ADMIN_KEY, config=toml,
                        env={"OMP_NUM_THREADS": "1", **env}, start_timeout=600)  # fmt: skip
    tid_a, key_a = new_tenant(proc.url, "room-a")
    tid_b, key_b = new_tenant(proc.url, "room-b")
    ids = {
        "r8": new_adapter(proc.url, "r8", tid_a, adapter_files(adapters["r8"])),
        "r16": new_adapter(proc.url, "r16", tid_a, adapter_files(adapters["r16"])),
        "r5": new_adapter(proc.url, "r5", tid_b, adapter_files(adapters["r5"])),
    }
    models = httpx.get(proc.url + "/v1/models", headers=auth(key_a), timeout=60).json()["data"]
    base = next(m["id"] for m in models if m["id"] not in ids)
    return proc, key_a, key_b, tid_b, ids, base


def _resolved(proc) -> dict[str, str]:
    out = {}
    for line in proc.output().splitlines():
        parts = line.split()
        if line.startswith("  ") and len(parts) >= 2:
            out.setdefault(parts[0], parts[-1])
    return out


# A server's step plans, read from outside: put this on its PYTHONPATH (LORAPLEX_TEST_PLANS = a file)
# and each schedule() appends "decodes waiting chunk:computed ..." (the sequences decoding and the
# requests waiting when the plan starts, then its prompt chunks and the positions computed before each). Patched when the scheduler module is first imported (an import hook), so
# the process that re-executes itself under the fast runtime pays nothing before the restart.
PLAN_LOG = """
import importlib.abc, importlib.util, os, sys

PATH = os.environ.get("LORAPLEX_TEST_PLANS")


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "loraplex.engine.scheduler":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            out = open(PATH, "a", buffering=1)
            schedule = module.Scheduler.schedule

            def logged(self):
                waiting = self.policy.num_waiting()
                decoding = {s.seq_id for s in self.running if s.in_decode}  # what the room is sized by
                plan = schedule(self)
                victims = sum(1 for s in plan.preempted if s.seq_id in decoding)
                chunks = [f"{c.num_tokens}:{c.seq.num_computed_tokens}" for c in plan.chunks if not c.seq.in_decode]
                out.write(" ".join(map(str, [len(decoding), waiting, victims, *chunks])) + "\\n")
                return plan

            module.Scheduler.schedule = logged

        spec.loader.exec_module = exec_and_patch
        return spec


if PATH:
    sys.meta_path.insert(0, _Hook())
"""


def _plans(path: Path) -> list[tuple[int, int, list[tuple[int, int]], int]]:
    """(decoding, waiting, [(chunk, computed before it)], decoding sequences preempted) per step."""
    rows = []
    for line in path.read_text().splitlines():
        d, w, v, *chunks = line.split()
        rows.append((int(d), int(w), [(int(n), int(done)) for n, done in (c.split(":") for c in chunks)], int(v)))
    return rows


@pytest.fixture(scope="module")
def room_server(demo_model_dir, adapters, tmp_path_factory):
    if not _kernels_here():
        pytest.skip("no AVX512-BF16 prompt kernels on this CPU")
    root = tmp_path_factory.mktemp("room-serve")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(PLAN_LOG)
    env = {
        "LORAPLEX_ENGINE__PREFILL_TOKENS_PER_DECODE": "4",
        "PYTHONPATH": os.pathsep.join(p for p in (str(root / "site"), os.environ.get("PYTHONPATH")) if p),
        "LORAPLEX_TEST_PLANS": str(root / "plans.txt"),
    }
    started = _start(root, demo_model_dir, adapters, env=env)
    proc = started[0]
    try:
        yield started
    finally:
        proc.kill()
    log = proc.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def _count(url: str, key: str, path: str, body: dict) -> int:
    """The prompt tokens the server bills ``body`` (its /tokenize, with the chat fields that shape
    the prompt); token-id prompts: their length."""
    if isinstance(body.get("prompt"), list):
        return len(body["prompt"])
    probe = {k: body[k] for k in ("model", "prompt", "messages", "tools") if k in body}
    r = httpx.post(url + "/tokenize", headers=auth(key), json=probe, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def _long_text(url: str, key: str, model: str, target: int) -> str:
    text = WORDS * (target // 8)
    while _count(url, key, "", {"model": model, "prompt": text}) > target:
        text = text[: int(len(text) * 0.93)]
    return text


def _keeper(url: str, key: str, body: dict, started, stop) -> int:
    """A long stream that keeps a sequence decoding: ``started`` is set at its first data line (or
    its end); the client hangs up once ``stop`` is set (the server aborts it). Its status."""
    try:
        with httpx.stream("POST", url + "/v1/completions", headers=auth(key), json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    started.set()
                if stop.is_set():
                    break
            return r.status_code
    finally:
        started.set()


class Keepers:
    """``n`` streams of ``max_tokens`` 1900 on the base model, decoding from ``__enter__`` (every one
    has sent a token) until ``__exit__`` (hung up): whatever arrives meanwhile joins running decodes."""

    def __init__(self, url: str, key: str, model: str, n: int):
        import threading

        self.stop = threading.Event()
        self.started = [threading.Event() for _ in range(n)]
        self.pool = cf.ThreadPoolExecutor(n)
        body = {"model": model, "max_tokens": 1900, "ignore_eos": True, "stream": True}
        self.futures = [
            self.pool.submit(_keeper, url, key, {**body, "prompt": WORDS[: 3 + i]}, ev, self.stop)
            for i, ev in enumerate(self.started)
        ]

    def __enter__(self):
        assert all(ev.wait(300) for ev in self.started)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        codes = [f.result(300) for f in self.futures]
        self.pool.shutdown()
        assert codes == [200] * len(codes), codes


def test_a_room_server_serves_a_hostile_mix_while_an_adapter_is_deleted_and_reuploaded(room_server, adapters):
    """prefill_tokens_per_decode = 4 (environment) over HTTP: 40 concurrent requests of two tenants
    while 8 streams decode for long (so long prompts are cut into room-sized chunks over their
    cached positions): prompts of ~1000-1900 tokens (text and token ids), streams with usage, n = 2,
    json_schema, tools (auto / required), stop strings, max_tokens = 1, echo + prompt_logprobs,
    adapters r8 / r16 / r5 and the base model; r5 deleted and uploaded again under load. No 5xx,
    every 200 stream ends with [DONE] and carries no error, usage prompt_tokens = the tokenized
    prompt, stop strings never in the text, json_schema answers parse, logprobs finite; r5 and the
    server answer afterwards."""
    proc, key_a, key_b, tid_b, ids, base = room_server
    url = proc.url
    assert _resolved(proc).get("prefill_tokens_per_decode") == "4", proc.output()[-2000:]
    plan_file = proc.data_dir.parent / "plans.txt"
    seen = len(_plans(plan_file)) if plan_file.exists() else 0
    tool = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}  # fmt: skip
    long1 = _long_text(url, key_a, base, 1900)
    long2 = _long_text(url, key_a, base, 1000)
    texts = [long1, long2, WORDS * 20, "🤖 日本語 \u202e" * 40, "<|endoftext|>" * 30, "x"]
    streams = [(key_a, "/v1/completions", {"model": [base, "r8"][i % 2], "prompt": WORDS[: 5 + i], "max_tokens": 150,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
               for i in range(8)]  # fmt: skip
    crowd = []
    for i in range(32):
        key, model = [(key_a, "r8"), (key_b, "r5"), (key_a, "r16"), (key_a, base)][i % 4]
        text, kind = texts[i % len(texts)], (i // 4) % 8
        msgs = [{"role": "user", "content": text}]
        if kind == 0:
            body = ("/v1/completions", {"model": model, "prompt": text, "max_tokens": 8, "n": 2, "temperature": 0.8,
                                        "seed": i, "logprobs": 2})  # fmt: skip
        elif kind == 1:
            body = ("/v1/completions", {"model": model, "prompt": text, "max_tokens": 12, "stream": True, "n": 2,
                    "stream_options": {"include_usage": True}, "logprobs": 1})  # fmt: skip
        elif kind == 2:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 40, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})  # fmt: skip
        elif kind == 3:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 30, "tools": tool,
                                             "tool_choice": ["auto", "required"][i % 2], "n": 2})  # fmt: skip
        elif kind == 4:
            body = ("/v1/completions", {"model": model, "prompt": text, "max_tokens": 30, "stop": ["o", "the"],
                                        "stream": True, "temperature": 0})  # fmt: skip
        elif kind == 5:
            body = ("/v1/completions", {"model": model, "prompt": text, "max_tokens": 1, "echo": True,
                                        "logprobs": 1, "prompt_logprobs": 1})  # fmt: skip
        elif kind == 6:
            body = ("/v1/completions", {"model": model, "prompt": _ids(1500 - 40 * i, i), "max_tokens": 6,
                                        "temperature": 0, "logprobs": 2})  # fmt: skip
        else:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 1, "stream": True,
                    "stream_options": {"include_usage": True}, "stop": ["e"]})  # fmt: skip
        crowd.append((key, model, *body))
    counts = [_count(url, key, path, body) for key, _, path, body in crowd]
    with Keepers(url, key_a, base, 4), cf.ThreadPoolExecutor(16) as ex:
        first = [ex.submit(fire, url, key, path, body) for key, path, body in streams]
        futures = [ex.submit(fire, url, key, path, body) for key, _, path, body in crowd]
        gone = httpx.delete(url + f"/admin/v1/adapters/{ids['r5']}", headers=auth(ADMIN_KEY), timeout=60)
        again = new_adapter(url, "r5", tid_b, adapter_files(adapters["r5"]))
        results = [f.result() for f in futures]
        stream_results = [f.result() for f in first]
    assert gone.status_code == 200, gone.text
    ids["r5"] = again
    for code, text in stream_results:
        assert code == 200 and text.rstrip().endswith("data: [DONE]"), (code, text[-300:])
        usage = [p["usage"] for p in payloads(text, True) if p.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == 150, usage
    bad = []
    for (_, model, path, body), (code, text), count in zip(crowd, results, counts):
        stream = bool(body.get("stream"))
        info = (code, path, {k: v for k, v in body.items() if k not in ("prompt", "messages", "tools")}, text[-300:])
        allowed = {200, 404, 409} if model == "r5" else {200}
        if count + body["max_tokens"] > ENGINE["max_model_len"]:  # our long text under a chat template + tools
            allowed = {400} | (allowed - {200})
            if code == 400 and "context_length_exceeded" not in text:
                bad.append(("a 400 that is not the context length", *info))
        if code not in allowed:
            bad.append(info)
            continue
        if code != 200:
            continue
        if stream and not text.rstrip().endswith("data: [DONE]"):
            bad.append(("no [DONE]", *info))
            continue
        events = payloads(text, stream)
        if any("error" in p for p in events):
            if model != "r5":  # r5's streams may end with the deletion's error
                bad.append(("error in a 200", *info))
            continue
        for where, v in (x for p in events for x in logprob_numbers(p)):
            assert math.isfinite(v), (where, v, info)
        usage = [p["usage"] for p in events if p.get("usage")]
        if not stream or body.get("stream_options"):
            assert usage and usage[-1]["prompt_tokens"] == count, ("usage", usage, count, info)
            if body["max_tokens"] == 1:
                assert usage[-1]["completion_tokens"] <= body.get("n", 1), ("max_tokens 1", usage, info)
        choices = [c for p in events for c in p.get("choices", [])]
        if "stop" in body and path == "/v1/completions":
            full = "".join(c.get("text") or "" for c in choices)
            assert not any(s in full for s in body["stop"]), ("a stop string in the text", full, info)
        if "response_format" in body:
            for choice in events[0]["choices"]:
                if choice["finish_reason"] == "stop":
                    assert set(json.loads(choice["message"]["content"])) >= {"a", "b"}, info
        if body.get("tool_choice") == "required":
            for choice in events[0]["choices"]:
                assert choice["finish_reason"] == "length" or choice["message"].get("tool_calls"), info
    assert not bad, bad[:5]
    assert sum(code == 200 for code, _ in results) >= 28
    # The server's own plans: every step beside decodes within the room, and long prompts really
    # went in chunks of >= 16 rows over cached positions (the kernel's new work) beside decodes.
    plans = _plans(plan_file)[seen:]
    over_cached = 0
    for decodes, waiting, chunks, victims in plans:
        if decodes and chunks:
            room = prompt_room(decodes, waiting, 4)
            assert room is not None and sum(n for n, _ in chunks) <= room, (decodes, waiting, chunks, room, victims)
            over_cached += sum(1 for n, done in chunks if n >= MIN_ROWS and done > 0)
    assert over_cached >= 10, plans[:40]
    status, text = fire(url, key_b, "/v1/completions", {"model": "r5", "prompt": WORDS * 30, "max_tokens": 4})
    assert status == 200, text[:300]
    assert httpx.get(url + "/health", timeout=60).status_code == 200


def test_a_room_servers_chunked_greedy_answers_agree_with_an_idle_engine(room_server, demo_model_dir, adapters):
    """Over HTTP at a room of 4: a 1200-token token-id prompt on r16 arrives while 6 streams decode
    (cut into room-sized chunks over its cached positions), then the same prompt + 17 tokens (a
    prefix hit: its 17-token rest over 1200 cached keys, on the kernel); greedy tokens and logprobs
    agree with an idle in-process engine under the old routing (the whole prompt through SDPA), up
    to near-ties of the server's top-2; the server's plans show both chunk shapes."""
    proc, key_a, _, _, _, base = room_server
    url = proc.url
    plan_file = proc.data_dir.parent / "plans.txt"
    idle = _engine(demo_model_dir, adapters, num_kv_blocks=400, enable_prefix_caching=False)
    prompt = _ids(1200, 1234)
    for ids in (prompt, prompt + _ids(17, 99)):
        seen = len(_plans(plan_file))
        body = {"model": "r16", "prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 2}
        with Keepers(url, key_a, base, 6):  # the prompt joins 6 running decodes
            status, text = fire(url, key_a, "/v1/completions", body)
        assert status == 200, text[:300]
        (got,) = json.loads(text)["choices"]
        assert json.loads(text)["usage"]["prompt_tokens"] == len(ids)
        chunks = [c for d, _, cs, _ in _plans(plan_file)[seen:] if d for c in cs]
        if len(ids) == 1200:
            assert sum(1 for n, done in chunks if n >= MIN_ROWS and done > 0) >= 10, chunks
        else:
            assert (17, 1200) in chunks, chunks
        greedy = SamplingParams(max_tokens=12, **GREEDY)
        (want,) = _waves(idle, old_ops(idle.engine.runner.ops), [[(ids, greedy, "r16")]])
        want_tokens = [idle.tokenizer.decode([t]) for t in want.outputs[0].token_ids]
        lps = got["logprobs"]["token_logprobs"]
        k = next((i for i, (x, y) in enumerate(zip(got["logprobs"]["tokens"], want_tokens)) if x != y), len(lps))
        for x, y in zip(lps[:k], [lp.logprob for lp in want.outputs[0].logprobs[:k]]):
            assert abs(x - y) <= LP_TOL, (len(ids), x, y)
        if k < len(lps):
            top = sorted(got["logprobs"]["top_logprobs"][k].values(), reverse=True)
            assert len(top) >= 2 and top[0] - top[1] <= TIE, (len(ids), k, got["logprobs"]["top_logprobs"][k])


def test_prefix_hits_over_http_stay_within_a_tenant(room_server):
    """The chunk after a prefix hit reads another request's cached blocks: only a tenant's own. A
    300-token prompt from tenant a on the base model, then the same prompt + 29 tokens from tenant b
    (no hit: its prefill starts at position 0) and from tenant a (a hit: its 29-token rest over 288
    cached keys); both answers greedy-equal where the prompts are equal."""
    proc, key_a, key_b, _, _, base = room_server
    plan_file = proc.data_dir.parent / "plans.txt"
    prompt = _ids(300, 4321)
    longer = prompt + _ids(29, 4322)
    status, _ = fire(proc.url, key_a, "/v1/completions", {"model": base, "prompt": prompt, "max_tokens": 2})
    assert status == 200
    for key, first_done in ((key_b, 0), (key_a, 288)):
        seen = len(_plans(plan_file))
        body = {"model": base, "prompt": longer, "max_tokens": 4, "temperature": 0, "logprobs": 2}
        status, text = fire(proc.url, key, "/v1/completions", body)
        assert status == 200, text[:300]
        chunks = [c for _, _, cs, _ in _plans(plan_file)[seen:] for c in cs]
        assert chunks and chunks[0][1] == first_done, (first_done, chunks)
        assert sum(n for n, _ in chunks) == len(longer) - first_done, chunks


def test_a_huge_room_serves_normally(tmp_path, demo_model_dir, adapters):
    """prefill_tokens_per_decode = 10**9 in the config file: the server starts (the resolved
    configuration says so), serves long prompts beside streams with usage equal to the tokenized
    prompt, and logs no traceback."""
    toml = SERVER_TOML + "prefill_tokens_per_decode = 1000000000\n"
    proc, key_a, key_b, _, _, base = _start(tmp_path, demo_model_dir, adapters, toml=toml,
                                            env={"LORAPLEX_ENGINE__PREFILL_TOKENS_PER_DECODE": None})  # fmt: skip
    try:
        assert _resolved(proc).get("prefill_tokens_per_decode") == "1000000000", proc.output()[-2000:]
        long = _long_text(proc.url, key_a, base, 1500)
        count = _count(proc.url, key_a, "", {"model": base, "prompt": long})
        jobs = [(key_a, {"model": base, "prompt": WORDS[:9], "max_tokens": 40, "ignore_eos": True, "stream": True})]
        jobs += [(key, {"model": m, "prompt": long, "max_tokens": 5, "n": 2, "temperature": 0.5})
                 for key, m in ((key_a, "r8"), (key_b, "r5"), (key_a, base))]  # fmt: skip
        with cf.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda j: fire(proc.url, j[0], "/v1/completions", j[1]), jobs))
        assert results[0][0] == 200 and results[0][1].rstrip().endswith("data: [DONE]"), results[0]
        for status, text in results[1:]:
            assert status == 200, text[:300]
            assert json.loads(text)["usage"]["prompt_tokens"] == count
    finally:
        proc.kill()
    assert "Traceback" not in proc.log.read_text(errors="replace")
