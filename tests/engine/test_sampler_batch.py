"""The batched sampler against a plain per-row reference (float64 loops over one row at a time),
for a batch of 64 rows that each ask for something different."""

from __future__ import annotations

import math
import random

import pytest
import torch

from loraplex.engine.sampler import TokenBitmask, process_logits, sample_batch, truncated_probs
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.sequence import Request, Sequence

V = 97


def _seq(params: SamplingParams, prompt: list[int], output: list[int], seed: int | None = None) -> Sequence:
    req = Request("r", prompt, params)
    seq = Sequence(request=req, index=0, token_ids=prompt + output, num_prompt_tokens=len(prompt))
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def _random_params(rng: random.Random) -> SamplingParams:
    greedy = rng.random() < 0.25
    return SamplingParams(
        temperature=0.0 if greedy else rng.choice([0.3, 0.7, 1.0, 1.5]),
        top_k=rng.choice([-1, -1, 1, 5, 20, V + 3]),
        top_p=rng.choice([1.0, 1.0, 0.9, 0.5, 0.1]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.3]),
        presence_penalty=rng.choice([0.0, 0.0, 0.5, -1.0, 2.0]),
        frequency_penalty=rng.choice([0.0, 0.0, 0.3, -0.5, 1.5]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.8]),
        logit_bias={rng.randrange(V): rng.choice([-100.0, -5.0, 3.0, 100.0]) for _ in range(rng.choice([0, 0, 1, 3]))},
        logprobs=rng.choice([None, None, 0, 3]),
    )


def _reference(
    row: torch.Tensor, p: SamplingParams, prompt: list[int], out: list[int], allowed: set[int] | None
) -> tuple[list[float] | None, int]:
    """(probabilities or None for greedy, argmax token) computed one token at a time."""
    x = [float(v) for v in row]
    if allowed is not None:
        x = [v if t in allowed else -math.inf for t, v in enumerate(x)]
    for t, b in p.logit_bias.items():
        x[t] += b
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(out):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(out):
        x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    best = max(range(V), key=lambda t: x[t])
    if p.greedy:
        return None, best
    x = [v / p.temperature for v in x]
    if 0 < p.top_k < V:
        kth = sorted(x, reverse=True)[p.top_k - 1]
        x = [v if v >= kth else -math.inf for v in x]

    def softmax(vals):
        m = max(vals)
        e = [math.exp(v - m) if v != -math.inf else 0.0 for v in vals]
        s = sum(e)
        return [v / s for v in e]

    if p.top_p < 1.0:
        probs = softmax(x)
        cum = 0.0
        for t in sorted(range(V), key=lambda t: -x[t]):
            if cum >= p.top_p:
                x[t] = -math.inf
            cum += probs[t]
    probs = softmax(x)
    if p.min_p > 0:
        floor = max(probs) * p.min_p
        probs = [q if q >= floor else 0.0 for q in probs]
        s = sum(probs)
        probs = [q / s for q in probs]
    return probs, best


def _pack(allowed: set[int]) -> torch.Tensor:
    words = [0] * (-(-V // 32))
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_64_mixed_rows_match_the_per_row_reference(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    logits = torch.randn(64, V) * 3
    before = logits.clone()
    seqs, allowed_sets = [], []
    for i in range(64):
        p = _random_params(rng)
        prompt = [rng.randrange(V) for _ in range(rng.randint(1, 6))]
        out = [rng.randrange(V) for _ in range(rng.randint(0, 12))]
        seqs.append(_seq(p, prompt, out, seed=i if rng.random() < 0.5 else None))
        allowed_sets.append(set(rng.sample(range(V), rng.randint(1, 30))) if rng.random() < 0.3 else None)
    rows = [i for i, a in enumerate(allowed_sets) if a is not None]
    bitmask = TokenBitmask(torch.stack([_pack(allowed_sets[i]) for i in rows]), rows)

    x = process_logits(logits, seqs, bitmask)
    draw = [i for i, s in enumerate(seqs) if not s.request.params.greedy]
    probs = truncated_probs(x[draw], [seqs[i].request.params for i in draw])
    out = sample_batch(logits, seqs, torch.Generator().manual_seed(0), bitmask)
    for i, s in enumerate(seqs):
        p = s.request.params
        ref_probs, ref_best = _reference(
            logits[i], p, s.token_ids[: s.num_prompt_tokens], s.token_ids[s.num_prompt_tokens :], allowed_sets[i]
        )
        if ref_probs is None:
            assert out.tokens[i] == ref_best, f"row {i}: greedy"
        else:
            got = probs[draw.index(i)]
            assert torch.allclose(got.double(), torch.tensor(ref_probs, dtype=torch.float64), atol=1e-5), f"row {i}"
            assert ref_probs[out.tokens[i]] > 0, f"row {i}: sampled a token outside the support"
        if allowed_sets[i] is not None:
            assert out.tokens[i] in allowed_sets[i]
        if p.logprobs is None:
            assert out.logprobs[i] is None
        else:
            raw = torch.log_softmax(logits[i].double(), -1)
            lp = out.logprobs[i]
            assert lp.token_id == out.tokens[i] and abs(lp.logprob - raw[out.tokens[i]].item()) < 1e-4
            assert [t for t, _ in lp.top] == raw.topk(p.logprobs).indices.tolist()
    assert torch.equal(logits, before)  # the input stays untouched (forks re-sample it)


def test_seeded_rows_ignore_the_rest_of_the_batch():
    logits = torch.randn(8, V)
    p = SamplingParams(temperature=1.0, top_p=0.9, presence_penalty=0.5)

    def draw(batch_rows: list[int]) -> int:
        seqs = [
            _seq(p, [1, 2], [3], seed=42) if r == 0 else _seq(SamplingParams(temperature=1.0), [1], [])
            for r in batch_rows
        ]
        lg = torch.stack([logits[r] for r in batch_rows])
        return sample_batch(lg, seqs, torch.Generator().manual_seed(len(batch_rows)), None).tokens[0]

    assert draw([0]) == draw([0, 1, 2, 3]) == draw([0, 5, 6, 7, 1, 2, 3])


def test_draw_frequencies_follow_the_truncated_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5, -3.0]])
    p = SamplingParams(temperature=1.0, top_k=3)
    seqs = [_seq(p, [0], []) for _ in range(4000)]
    toks = sample_batch(logits.expand(4000, -1), seqs, torch.Generator().manual_seed(3)).tokens
    counts = torch.bincount(torch.tensor(toks), minlength=5).double() / 4000
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0, 0.5, -math.inf]).double(), -1)
    want[0] = 0.0  # top-3 keeps {2, 1, 3}
    want = want / want.sum()
    assert torch.allclose(counts, want, atol=0.03)


def test_wide_nucleus_widens_the_candidate_set_to_the_exact_distribution():
    """Flat logits over a large vocabulary: the top-p nucleus holds thousands of tokens, beyond the
    first candidate set; the result must still equal a full-sort reference."""
    torch.manual_seed(0)
    vocab = 6000
    logits = torch.randn(3, vocab) * 0.5
    params = [
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.3, min_p=0.2),
        SamplingParams(temperature=1.2, top_k=3000, top_p=0.95),
    ]
    got = truncated_probs(logits.clone(), params)
    for row, p in enumerate(params):
        x = logits[row].double() / p.temperature
        order = x.argsort(descending=True)
        keep = torch.zeros(vocab, dtype=torch.bool)
        kk = p.top_k if p.top_k > 0 else vocab
        cand = order[:kk]
        probs = torch.softmax(x[cand], -1)
        before = probs.cumsum(-1) - probs
        keep[cand[before < p.top_p]] = True
        ref = torch.softmax(x.masked_fill(~keep, float("-inf")), -1)
        if p.min_p:
            ref = ref.masked_fill(ref < ref.max() * p.min_p, 0.0)
            ref = ref / ref.sum()
        assert int(keep.sum()) > 256 or row == 1
        assert torch.allclose(got[row].double(), ref, atol=1e-6), row
