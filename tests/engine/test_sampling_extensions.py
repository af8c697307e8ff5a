"""vLLM's sampling extensions in the engine's sampler: min_tokens, bad_words, allowed_token_ids.
Oracle: the unconstrained greedy output of the same prompt (what the masks must change, and where)."""

from __future__ import annotations

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.errors import InvalidRequestError

PROMPT = [3, 4, 5, 6]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=tiny_llama, max_num_seqs=8, block_size=8, num_kv_blocks=128)


def _greedy(llm, **kw) -> list[int]:
    params = SamplingParams(max_tokens=kw.pop("max_tokens", 12), temperature=0.0, **kw)
    return list(llm.generate([PROMPT], params)[0].outputs[0].token_ids)


def test_bad_words_mask_single_tokens_and_the_last_token_of_sequences(llm):
    free = _greedy(llm, ignore_eos=True)
    banned = free[0]
    out = _greedy(llm, ignore_eos=True, bad_words_token_ids=[[banned]])
    assert banned not in out and out != free
    # a two-token word: its second token may not follow its first (and only there)
    a, b = free[2], free[3]
    pair = _greedy(llm, ignore_eos=True, bad_words_token_ids=[[a, b]])
    assert pair[:3] == free[:3] and pair[3] != b
    assert all(not (x == a and y == b) for x, y in zip(pair, pair[1:]))


def test_allowed_token_ids_restrict_every_draw(llm):
    allowed = [7, 11, 13, 17]
    for seed in range(3):
        params = SamplingParams(max_tokens=10, temperature=1.5, seed=seed, ignore_eos=True, allowed_token_ids=allowed)
        out = llm.generate([PROMPT], params)[0].outputs[0].token_ids
        assert len(out) == 10 and set(out) <= set(allowed)


def test_min_tokens_holds_back_eos_and_stop_ids(llm):
    free = _greedy(llm, ignore_eos=True)
    stop = free[1]  # greedy stops at its 2nd token without min_tokens
    early = _greedy(llm, stop_token_ids=[stop])
    assert early == free[:2]
    held = _greedy(llm, stop_token_ids=[stop], min_tokens=6)
    assert len(held) >= 6 and stop not in held[:5]
    eos = llm.engine.eos_token_ids
    forced = _greedy(llm, logit_bias={t: 100.0 for t in eos}, max_tokens=8)
    assert len(forced) == 1 and forced[0] in eos  # the bias makes EOS the first token...
    later = _greedy(llm, logit_bias={t: 100.0 for t in eos}, max_tokens=8, min_tokens=4)
    assert len(later) == 5 and not set(later[:4]) & eos and later[4] in eos  # ...until min_tokens


def test_bad_values_are_refused():
    for kw in (
        dict(min_tokens=-1),
        dict(min_tokens=20, max_tokens=10),
        dict(bad_words_token_ids=[[]]),
        dict(allowed_token_ids=[]),
        dict(allowed_token_ids=[-1]),
    ):
        with pytest.raises(InvalidRequestError):
            SamplingParams(**kw)
    assert SamplingParams(min_tokens=2).speculative is False  # masks are not verified by drafts
