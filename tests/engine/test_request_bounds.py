"""Per-request work on the engine thread is bounded (issue 32 item 3): stop strings and logit_bias
are capped (configurable, 400 naming the field), the stop check looks only at the window the new
text can complete, and logit_bias is one vectorised scatter per step."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from loraplex.engine.config import RequestLimits
from loraplex.engine.detokenizer import find_stop_string
from loraplex.engine.request import EngineRequest
from loraplex.engine.sampler import process_logits
from loraplex.engine.sampling_params import check_request_limits

# ---------------------------------------------------------------------------------------- stop


def _naive_first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The oracle: the earliest occurrence of any stop in the whole text (ties: the first listed)."""
    best = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    return best


_ALPHABET = "ab c\n"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=_ALPHABET, max_size=60),
    stops=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=5), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=1, max_value=7), max_size=40),
)
def test_incremental_stop_search_finds_what_a_whole_text_search_finds(text, stops, cuts):
    """Fed in random chunks (as tokens spell text), the windowed search reports the first stop at
    exactly the chunk and index where a search of the whole text so far first finds one."""
    seen = ""
    pos = 0
    sizes = iter(cuts)
    while pos < len(text):
        step = next(sizes, 3)
        chunk = text[pos : pos + step]
        pos += len(chunk)
        seen += chunk
        got = find_stop_string(seen, stops, len(chunk))
        want = _naive_first_stop(seen, stops)
        assert got == want, (seen, stops, chunk)
        if got is not None:
            return
    assert _naive_first_stop(text, stops) is None


def test_stop_limits_count_and_total_length_name_the_field():
    limits = RequestLimits(max_stop_strings=4, max_stop_chars=10)
    check_request_limits(SamplingParams(stop=["a", "b", "c", "d"]), limits)  # at the limit: fine
    check_request_limits(SamplingParams(stop=["abcde", "fghij"]), limits)
    for stop in (["a", "b", "c", "d", "e"], ["abcdef", "ghijk"]):
        with pytest.raises(InvalidRequestError) as err:
            check_request_limits(SamplingParams(stop=stop), limits)
        assert err.value.param == "stop"


def test_logit_bias_limit_names_the_field():
    limits = RequestLimits(max_logit_bias=3)
    check_request_limits(SamplingParams(logit_bias={1: 1.0, 2: 2.0, 3: 3.0}), limits)
    with pytest.raises(InvalidRequestError) as err:
        check_request_limits(SamplingParams(logit_bias={i: 1.0 for i in range(4)}), limits)
    assert err.value.param == "logit_bias"


def test_defaults_are_documented_values():
    limits = RequestLimits()
    assert (limits.max_stop_strings, limits.max_stop_chars, limits.max_logit_bias) == (16, 1024, 300)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(
        EngineConfig(
            model=tiny_llama, dtype="float32", max_num_seqs=8, num_kv_blocks=64, max_stop_strings=2, max_logit_bias=5
        )
    )


def test_engine_refuses_over_its_configured_limits(engine):
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(EngineRequest([1, 2, 3], SamplingParams(stop=["x", "y", "z"])))
    assert err.value.param == "stop"
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(EngineRequest([1, 2, 3], SamplingParams(logit_bias={i: 1.0 for i in range(6)})))
    assert err.value.param == "logit_bias"
    assert not engine.requests  # nothing was queued
    engine.add_request(EngineRequest([1, 2, 3], SamplingParams(stop=["x", "y"], max_tokens=2)))
    while engine.has_unfinished_requests():
        engine.step()


def test_config_refuses_nonsense_limits(tiny_llama):
    with pytest.raises(ValueError, match="max_stop_strings"):
        EngineConfig.check(max_stop_strings=0)
    with pytest.raises(ValueError, match="structured_compile_timeout_s"):
        EngineConfig.check(structured_compile_timeout_s=0)


# ---------------------------------------------------------------------------------- logit_bias


class _Req:
    def __init__(self, params):
        self.params = params


class _Seq:
    def __init__(self, params):
        self.request = _Req(params)
        self.token_ids: list[int] = []
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_logit_bias_equals_a_per_row_reference(seed):
    rng = random.Random(seed)
    vocab = 97
    params = []
    for _ in range(7):
        bias = {rng.randrange(vocab + 5): rng.uniform(-100, 100) for _ in range(rng.choice([0, 1, 5, 40]))}
        params.append(SamplingParams(logit_bias=bias))
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(seed))
    seqs = [_Seq(p) for p in params]
    want = logits.float().clone()
    for r, p in enumerate(params):  # the reference: one entry at a time, ids beyond the vocabulary skipped
        for t, b in p.logit_bias.items():
            if t < vocab:
                want[r, t] += b
    for _ in range(2):  # the second step reads the cached tensors
        got = process_logits(logits, seqs)
        torch.testing.assert_close(got, want)
    assert torch.equal(logits, logits.clone())  # never modified in place
