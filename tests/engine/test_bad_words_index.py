"""The sampler's bad_words check (indexed by each word's next-to-last token) against vLLM's rule
written the naive way (every word checked at every step), on random words and outputs; and the
engine's own bound on how many token sequences a request may carry (issue 32, hostile round 2)."""

from __future__ import annotations

import random

import pytest

from loraplex.engine import InvalidRequestError, RequestLimits, SamplingParams, check_request_limits
from loraplex.engine.sampler import _bad_words_index, banned_by_bad_words


def naive_banned(words: list[list[int]], output: list[int]) -> set[int]:
    """vLLM's rule: a word's last token is banned when the output ends with the rest of the word."""
    out: set[int] = set()
    for w in words:
        n = len(w) - 1
        if n == 0 or (len(output) >= n and output[len(output) - n :] == w[:-1]):
            out.add(w[-1])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_indexed_bad_words_ban_what_the_naive_rule_bans(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12, 50])  # small vocabularies: many prefixes shared, many matches
    words = [[rng.randrange(vocab) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 40))]
    params = SamplingParams(max_tokens=4, bad_words_token_ids=words)
    index = _bad_words_index(params)
    assert _bad_words_index(params) is index  # built once per request
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 6))]
    output: list[int] = []
    for _ in range(30):  # every prefix of a random output, as the steps see it
        got = banned_by_bad_words(index, prompt + output, len(prompt))
        assert got == naive_banned(words, output), (words, prompt, output)
        output.append(rng.randrange(vocab))


def test_the_prompt_never_completes_a_bad_word():
    params = SamplingParams(max_tokens=4, bad_words_token_ids=[[1, 2, 3], [9]])
    index = _bad_words_index(params)
    assert banned_by_bad_words(index, [1, 2], 2) == {9}  # [1, 2] is the prompt, not the output
    assert banned_by_bad_words(index, [1, 1, 2], 1) == {9, 3}


def test_the_engine_refuses_more_token_sequences_than_two_forms_per_word():
    limits = RequestLimits(max_bad_words=3)
    ok = SamplingParams(max_tokens=4, bad_words_token_ids=[[i] for i in range(6)])
    check_request_limits(ok, limits)
    over = SamplingParams(max_tokens=4, bad_words_token_ids=[[i] for i in range(7)])
    with pytest.raises(InvalidRequestError) as err:
        check_request_limits(over, limits)
    assert err.value.param == "bad_words"
    with pytest.raises(ValueError, match="max_bad_words_chars"):
        RequestLimits(max_bad_words_chars=0)


def test_words_sharing_a_prefix_are_one_lookup_and_all_banned():
    words = [[7] * 7 + [i] for i in range(512)] + [[5, 7, 9], [6, 7, 10]]
    index = _bad_words_index(SamplingParams(max_tokens=4, bad_words_token_ids=words))
    assert len(index[1][7]) == 2  # by the length of what precedes the next-to-last token: 6 and 1
    out = [7] * 10
    assert banned_by_bad_words(index, out, 0) == naive_banned(words, out) == set(range(512))
    assert banned_by_bad_words(index, [5, 7], 0) == naive_banned(words, [5, 7]) == {9}
