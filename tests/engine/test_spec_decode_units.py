"""The self-contained pieces of speculative decoding: n-gram proposer, acceptance rules (exact
greedy; rejection sampling keeps the target distribution: chi-square on a small vocabulary, with a
broken rule as the negative control), and adaptive k."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.spec_decode import AdaptiveK, NgramProposer, SpecState, verify_greedy, verify_sampled


# ---------------------------------------------------------------------------------- n-gram
def test_ngram_proposes_continuation_of_latest_longest_match():
    prop = NgramProposer(max_n=3, min_n=1)
    #        0  1  2  3  4  5  6  7  8  9 10
    toks = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # Suffix [1, 2, 3] occurs at 0 and 5: the latest (5) wins, continuation 7, 8, 1, ...
    assert prop.propose(toks, 3) == [7, 8, 1]
    assert prop.propose(toks, 1) == [7]
    assert prop.propose(toks, 0) == []
    # Longest n first: suffix [5, 3] matches nothing, [3] alone matches at index 2 -> 4.
    assert NgramProposer(max_n=2).propose([3, 4, 5, 3], 2) == [4, 5]
    assert NgramProposer(max_n=2, min_n=2).propose([3, 4, 5, 3], 2) == []
    assert prop.propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert prop.propose([5], 3) == []
    # A match at the very end proposes what exists (fewer than k).
    assert prop.propose([4, 6, 4], 5) == [6, 4]


def test_ngram_rejects_bad_sizes():
    with pytest.raises(ValueError):
        NgramProposer(max_n=1, min_n=2)


# ---------------------------------------------------------------------------------- greedy
def test_greedy_acceptance_is_prefix_plus_target_token():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all accepted + bonus
    assert verify_greedy([5, 6, 7], [5, 1, 7, 8]) == [5, 1]  # mismatch at 1: target's token replaces it
    assert verify_greedy([5, 6, 7], [4, 6, 7, 8]) == [4]
    assert verify_greedy([], [9]) == [9]


# ---------------------------------------------------------------------------------- sampling
V = 5
P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
Q = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.35])  # a draft that prefers what the target does not
CHI2_CRIT_DF4_P001 = 18.467  # chi-square critical value, 4 degrees of freedom, p = 0.001


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def _stream(num_tokens: int, k: int, gen: torch.Generator, rule=verify_sampled, point_mass=False) -> list[int]:
    """Generate num_tokens tokens by rounds of k proposals verified against a context-free target P."""
    out: list[int] = []
    while len(out) < num_tokens:
        if point_mass:  # n-gram-like: a deterministic proposal, no distribution
            draft, q = [3] * k, None
        else:
            draft = torch.multinomial(Q, k, replacement=True, generator=gen).tolist()
            q = Q.expand(k, V)
        out.extend(rule(draft, q, P.expand(k + 1, V), gen))
    return out[:num_tokens]


# Chi-square over 4000 trials, a Python loop per draft: the inner loop keeps k = 2 with a point-mass
# draft (accepted drafts and the bonus token); k = 1 and k = 3 run in the whole suite.
@pytest.mark.parametrize(
    "k,point_mass",
    [pytest.param(1, False, marks=pytest.mark.slow), pytest.param(3, False, marks=pytest.mark.slow), (2, True)],
)
def test_rejection_sampling_keeps_the_target_distribution(k, point_mass):
    gen = torch.Generator().manual_seed(1234 + k)
    trials, positions = 4000, 3
    counts = torch.zeros(positions, V)
    for _ in range(trials):
        for pos, tok in enumerate(_stream(positions, k, gen, point_mass=point_mass)):
            counts[pos, tok] += 1
    for pos in range(positions):  # every emitted position, first, accepted-draft and bonus alike
        assert _chi2(counts[pos], P) < CHI2_CRIT_DF4_P001, (pos, counts[pos] / trials)


def test_chi_square_detects_a_wrong_acceptance_rule():
    """Negative control: keeping every draft token emits the draft's distribution, and the same
    test must reject it."""

    def accept_all(draft, q, p, gen):
        return list(draft) + [int(torch.multinomial(p[len(draft)], 1, generator=gen))]

    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(V)
    for _ in range(4000):
        counts[_stream(1, 2, gen, rule=accept_all)[0]] += 1
    assert _chi2(counts, P) > 10 * CHI2_CRIT_DF4_P001


def test_rejection_sampling_is_reproducible_per_seed():
    a = _stream(50, 3, torch.Generator().manual_seed(5))
    b = _stream(50, 3, torch.Generator().manual_seed(5))
    c = _stream(50, 3, torch.Generator().manual_seed(6))
    assert a == b and a != c


def test_identical_draft_and_target_accept_everything():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        draft = torch.multinomial(P, 4, replacement=True, generator=gen).tolist()
        assert verify_sampled(draft, P.expand(4, V), P.expand(5, V), gen)[:4] == draft


# ---------------------------------------------------------------------------------- adaptive k
def test_adaptive_k_backs_off_and_probes_again():
    ak = AdaptiveK(k_max=4, smoothing=0.5, off_below=0.2, probe_every=3)
    st = SpecState()
    assert ak.next_k(st) == 4
    for _ in range(6):
        ak.update(st, 4, 0)  # everything rejected
    assert st.rate < 0.2
    ks = [ak.next_k(st) for _ in range(6)]
    assert ks == [0, 0, 1, 0, 0, 1]  # off, with a one-token probe every 3 steps
    ak.update(st, 1, 1)
    ak.update(st, 1, 1)
    assert ak.next_k(st) >= 2  # accepted probes bring speculation back
    for _ in range(10):
        ak.update(st, 4, 4)
    assert ak.next_k(st) == 4
    assert AdaptiveK(k_max=3, enabled=False).next_k(SpecState(rate=0.0)) == 3
