"""Resuming a request from its checkpoint (``EngineRequest.resume_token_ids``): what a replica that
died mid-stream had generated is handed to another engine, which must continue exactly where the
uninterrupted request would have gone. The oracle is the same engine running the request whole."""

from __future__ import annotations

import json

import jsonschema
import pytest

from loraplex.engine import LLM, EngineRequest, InvalidRequestError, OutputKind, SamplingParams
from loraplex.engine.sampling_params import StructuredOutputSpec

PROMPT = [5, 6, 7, 8, 9]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=tiny_llama, max_num_seqs=8, block_size=8, num_kv_blocks=256, dtype="float32")


def _run(llm: LLM, params: SamplingParams, resume: list[int] | None = None, kind=OutputKind.FINAL_ONLY):
    """Run one request alone; returns every output it produced (the last is final)."""
    eng = llm.engine
    req = eng.add_request(EngineRequest(PROMPT, params, output_kind=kind, resume_token_ids=list(resume or [])))
    outs = []
    while True:
        for out in eng.step():
            if out.request_id == req.request_id:
                outs.append(out)
                if out.finished:
                    return outs


def _final(llm: LLM, params: SamplingParams, resume: list[int] | None = None):
    return _run(llm, params, resume)[-1]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, top_k=40, seed=3, ignore_eos=True),
        # penalties read the output so far: the resumed tokens must count as output
        SamplingParams(max_tokens=24, temperature=1.0, seed=5, presence_penalty=1.5, frequency_penalty=1.0),
        SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.8, ignore_eos=True),
    ],
    ids=["greedy", "seeded", "seeded-top-p-k", "seeded-penalties", "greedy-repetition"],
)
def test_resumed_request_equals_the_uninterrupted_one(llm, params):
    whole = _final(llm, params)
    assert len(whole.token_ids) >= 4
    for k in (1, len(whole.token_ids) // 2, len(whole.token_ids) - 1):
        resumed = _final(llm, params, whole.token_ids[:k])
        assert resumed.token_ids == whole.token_ids, k
        assert resumed.text == whole.text
        assert resumed.finish_reason == whole.finish_reason
        assert resumed.prompt_token_ids == PROMPT  # the resumed tokens are output, not prompt


def test_seeded_resume_differs_without_the_advanced_generator(llm):
    """The oracle can tell: the same seed restarted from zero draws (what a plain re-submit of
    prompt + tokens would do) gives another continuation."""
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    whole = _final(llm, params)
    k = 8
    restarted = llm.generate(
        [PROMPT + whole.token_ids[:k]],
        SamplingParams(max_tokens=24 - k, temperature=1.0, seed=11, ignore_eos=True),
    )[0]
    assert restarted.token_ids != whole.token_ids[k:]


def test_max_tokens_counts_the_resumed_tokens(llm):
    whole = _final(llm, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    resumed = _final(llm, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), whole.token_ids[:6])
    assert len(resumed.token_ids) == 10 and resumed.finish_reason == "length"


def test_stop_string_across_the_boundary(llm):
    free = _final(llm, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    # a stop string made of the end of token k-1's text and the start of token k's
    tok = llm.tokenizer
    k = next(
        i
        for i in range(4, len(free.token_ids))
        if tok.decode(free.token_ids[i - 1 : i]).strip() and tok.decode(free.token_ids[i : i + 1]).strip()
    )
    before = tok.decode(free.token_ids[:k])
    after = tok.decode(free.token_ids[: k + 1])
    stop = before[-2:] + after[len(before) : len(before) + 1]
    assert len(stop) >= 2 and stop not in before
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop])
    whole = _final(llm, params)
    assert whole.finish_reason == "stop" and whole.outputs[0].stop_reason == stop
    resumed = _final(llm, params, whole.token_ids[:k])
    assert (resumed.token_ids, resumed.text, resumed.outputs[0].stop_reason) == (
        whole.token_ids,
        whole.text,
        whole.outputs[0].stop_reason,
    )


def test_delta_outputs_repeat_the_resumed_tokens_first_with_empty_logprobs(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=9, ignore_eos=True, logprobs=2)
    whole = _final(llm, params)
    k = 5
    outs = _run(llm, params, whole.token_ids[:k], kind=OutputKind.DELTA)
    tokens = [t for o in outs for t in o.outputs[0].token_ids]
    lps = [lp for o in outs for lp in o.outputs[0].logprobs or []]
    assert tokens == whole.token_ids
    assert "".join(o.outputs[0].text for o in outs) == whole.text
    assert lps[:k] == [None] * k
    assert [lp.token_id for lp in lps[k:]] == whole.token_ids[k:]
    for got, want in zip(lps[k:], whole.outputs[0].logprobs[k:]):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_structured_output_continues_the_grammar(llm):
    params = SamplingParams(
        max_tokens=80, temperature=1.0, seed=4, structured_output=StructuredOutputSpec.json_schema(SCHEMA)
    )
    whole = _final(llm, params)
    assert whole.finish_reason == "stop"
    jsonschema.validate(json.loads(whole.text), SCHEMA)
    for k in (1, len(whole.token_ids) // 2):
        resumed = _final(llm, params, whole.token_ids[:k])
        assert resumed.token_ids == whole.token_ids
        jsonschema.validate(json.loads(resumed.text), SCHEMA)


def test_bad_resumptions_are_refused(llm):
    with pytest.raises(InvalidRequestError, match="n must be 1"):
        llm.engine.add_request(EngineRequest(PROMPT, SamplingParams(n=2, max_tokens=8), resume_token_ids=[1]))
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        llm.engine.add_request(EngineRequest(PROMPT, SamplingParams(max_tokens=2), resume_token_ids=[1, 2]))
    with pytest.raises(InvalidRequestError, match="resume_token_ids"):
        llm.engine.add_request(EngineRequest(PROMPT, SamplingParams(max_tokens=8), resume_token_ids=[-1]))
    assert not llm.engine.requests


@pytest.mark.parametrize("k", [1, 2, 15, 16, 17, 255, 1000, 4096])
def test_advancing_a_generator_equals_sampling_that_many_tokens(k):
    """What sample_batch does per drawn token (one uniform from the row's generator) k times leaves
    the generator where ``advance_seeded_generator`` puts it in one call."""
    import torch

    from loraplex.engine.sampler import advance_seeded_generator

    drawn, advanced = torch.Generator().manual_seed(123), torch.Generator().manual_seed(123)
    for _ in range(k):
        torch.rand(1, generator=drawn)
    advance_seeded_generator(advanced, k)
    assert torch.rand(4, generator=drawn).tolist() == torch.rand(4, generator=advanced).tolist()
