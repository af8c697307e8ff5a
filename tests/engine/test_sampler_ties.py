"""Ties in the sampler's top-k (``sampler.topk_canonical``): bf16 logits tie often, and torch's
order among equal values follows ``k`` and the rows beside it. A row's top logprobs, and the
candidates a seeded top-k / top-p row draws from, must not depend on what else shares its step:
the oracle is a stable full sort of the row (value descending, token id ascending), one row alone.
Found by a hostile run of ``batch_invariant = true`` (the same request alone and in a burst gave the
same tokens and logprob values but other tied tokens in ``top_logprobs``)."""

from __future__ import annotations

import random

import pytest
import torch

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.sampler import sample_batch, topk_canonical
from loraplex.engine.sequence import Request, Sequence

V = 211


def _tied_rows(n: int, seed: int) -> torch.Tensor:
    """Rows whose values come from a handful of levels: ties everywhere, also at every top-k edge."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([4.0, 3.5, 3.5, 2.0, 1.0, 0.0, -1.0, float("-inf")])
    return levels[torch.randint(0, len(levels), (n, V), generator=g)]


def _oracle(row: torch.Tensor, k: int) -> tuple[list[float], list[int]]:
    order = sorted(range(len(row)), key=lambda t: (-float(row[t]), t))[:k]
    return [float(row[t]) for t in order], order


@pytest.mark.parametrize("k", [1, 2, 3, 7, 20, V])
def test_the_top_k_of_a_row_is_the_stable_sort_whatever_k_or_batch(k):
    rows = _tied_rows(12, seed=k)
    vals, ids = topk_canonical(rows, k)
    for r in range(len(rows)):
        assert (vals[r].tolist(), ids[r].tolist()) == _oracle(rows[r], k), r
        alone_v, alone_i = topk_canonical(rows[r : r + 1], k)
        assert torch.equal(alone_i[0], ids[r]) and torch.equal(alone_v[0], vals[r])
        wide_v, wide_i = topk_canonical(rows[r : r + 1], min(V, k + 13))  # a larger k beside it
        assert torch.equal(wide_i[0, :k], ids[r])


def test_rows_without_ties_are_torchs_topk_and_nan_rows_do_not_break_it():
    x = torch.randn(5, V, generator=torch.Generator().manual_seed(1))
    assert torch.equal(topk_canonical(x, 6)[1], x.topk(6, dim=-1)[1])
    y = _tied_rows(3, seed=2)
    y[1, 7] = float("nan")
    vals, ids = topk_canonical(y, 4)
    assert ids.shape == (3, 4) and vals.shape == (3, 4)
    assert _oracle(y[0], 4) == (vals[0].tolist(), ids[0].tolist())


def _seq(params: SamplingParams, seed: int | None) -> Sequence:
    seq = Sequence(request=Request("r", [1, 2, 3], params), index=0, token_ids=[1, 2, 3], num_prompt_tokens=3)
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def test_a_seeded_top_k_row_and_its_top_logprobs_do_not_depend_on_its_neighbours():
    """Alone, then beside rows asking for a larger top_k / more logprobs: the same draw and list."""
    rows = _tied_rows(4, seed=5)
    mine = SamplingParams(temperature=0.8, top_k=3, seed=1, logprobs=2, max_tokens=4)
    others = [
        SamplingParams(temperature=0.7, top_k=50, seed=2, logprobs=20, max_tokens=4),
        SamplingParams(temperature=0.0, logprobs=9, max_tokens=4),
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, logprobs=5, max_tokens=4),
    ]
    for seed in range(40):
        alone = sample_batch(rows[:1], [_seq(mine, seed)], torch.Generator().manual_seed(0))
        crowd = sample_batch(
            rows, [_seq(mine, seed), *(_seq(p, seed + 7) for p in others)], torch.Generator().manual_seed(0)
        )
        assert crowd.tokens[0] == alone.tokens[0], seed
        assert crowd.logprobs[0] == alone.logprobs[0], seed


@pytest.mark.slow
def test_batch_invariant_logprobs_alone_and_in_a_mixed_batch(model_factory):
    """The engine level: bf16 with ``batch_invariant``, requests with different ``logprobs`` counts,
    greedy and seeded top-k, alone and all together: the same tokens and the same top lists."""
    llm = LLM(model_factory("llama3_rope_tied_bf16"), dtype="bfloat16", batch_invariant=True, max_num_seqs=16)
    rng = random.Random(3)
    vocab = llm.engine.runner.model.config.vocab_size
    reqs = []
    for i in range(10):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.choice([4, 30, 90]))]
        k = [1, 5, 20, 0, 2][i % 5]
        if i % 2:
            sp = SamplingParams(max_tokens=12, temperature=0.9, top_k=4, seed=50 + i, logprobs=k, ignore_eos=True)
        else:
            sp = SamplingParams(max_tokens=12, temperature=0.0, logprobs=k, prompt_logprobs=k, ignore_eos=True)
        reqs.append((prompt, sp))

    def view(out):
        gen = [(o.token_ids, [(lp.token_id, lp.top) for lp in o.logprobs or [] if lp]) for o in out.outputs]
        return gen, [(lp.token_id, lp.top) for lp in out.prompt_logprobs or [] if lp]

    alone = [view(llm.generate([p], sp)[0]) for p, sp in reqs]
    together = [view(o) for o in llm.generate([p for p, _ in reqs], [sp for _, sp in reqs])]
    assert together == alone
