"""Sampling controls: seeds, top-k/top-p, temperature, stop strings, stop ids, eos, finish reasons."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.sampler import sample
from loraplex.engine.sampling_params import SamplingParams as SP
from loraplex.engine.sequence import Request, Sequence


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=tiny_llama, max_num_seqs=8, block_size=8, num_kv_blocks=128)


def _seq(params: SP) -> Sequence:
    req = Request("r", [1], params)
    return Sequence(request=req, index=0, token_ids=[1], num_prompt_tokens=1)


def test_top_k_restricts_to_k_best_tokens():
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, -1.0, 2.0]])
    gen = torch.Generator().manual_seed(0)
    seen = {sample(logits, [_seq(SP(temperature=5.0, top_k=2))], gen)[0] for _ in range(200)}
    assert seen == {1, 2}


def test_top_p_keeps_smallest_nucleus():
    # probs ~ [0.5, 0.3, 0.15, 0.05]: top_p=0.7 keeps {0, 1} (0.5 < 0.7 <= 0.8).
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    gen = torch.Generator().manual_seed(0)
    seen = {sample(probs.log(), [_seq(SP(temperature=1.0, top_p=0.7))], gen)[0] for _ in range(300)}
    assert seen == {0, 1}


def test_sampling_frequencies_follow_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample(logits, [_seq(SP(temperature=1.0))], gen)[0]] += 1
    assert torch.allclose(counts / 3000, torch.softmax(logits[0], -1), atol=0.03)


def test_seed_makes_sampling_reproducible_regardless_of_batch(llm):
    # The sampler's half of the promise: a seeded row's draws come from its own generator. On this
    # tiny fp32 model the logits' last bits do not flip a token; the forward's half (logits that
    # do not move with the batch) is batch_invariant's, tested in test_batch_invariance.py.
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=42, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], p)[0].token_ids
    crowd = llm.generate(
        [[9, 9], [5, 6, 7], [11] * 20],
        [SamplingParams(max_tokens=16, temperature=1.0), p, SamplingParams(max_tokens=8, temperature=0.7)],
    )
    assert crowd[1].token_ids == alone
    other = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=16, temperature=1.0, seed=43, ignore_eos=True))
    assert other[0].token_ids != alone


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    topk1 = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=10, temperature=1.3, top_k=1, ignore_eos=True))
    assert greedy[0].token_ids == topk1[0].token_ids


def test_stop_token_ids_and_length(llm):
    full = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 12
    stop_at = full.token_ids[4]
    first = full.token_ids.index(stop_at)
    out = llm.generate(
        [[3, 4, 5]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_at])
    )[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop_at
    assert out.token_ids == full.token_ids[: first + 1]


def test_stop_string_truncates_text(llm):
    full = llm.generate(["Hello"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    text = full.text
    assert len(text) >= 6
    stop = text[3:6]
    out = llm.generate(["Hello"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate(
        ["Hello"],
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
    )[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_eos_stops_unless_ignored(llm):
    eos = llm.tokenizer.eos_token_id
    # Force EOS: bias is not available, so use a stop via eos id detection on a greedy run whose
    # continuation we make the engine treat as eos by marking its first token as an eos id.
    full = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    scheduler = llm.engine.scheduler
    original = scheduler.eos_token_ids
    scheduler.eos_token_ids = original | {full.token_ids[2]}
    try:
        out = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=6, temperature=0.0))[0]
        assert (
            out.finish_reason == "stop"
            and out.token_ids == full.token_ids[: full.token_ids.index(full.token_ids[2]) + 1]
        )
        ignored = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
        assert ignored.token_ids == full.token_ids and ignored.finish_reason == "length"
    finally:
        scheduler.eos_token_ids = original
    assert eos in original


def test_streamed_text_equals_one_shot_decode(llm):
    """The incremental detokenizer (DELTA outputs, one step at a time) must spell exactly what a
    one-shot decode of all the tokens spells — sampled text from a byte-level BPE splits UTF-8."""
    from loraplex.engine import EngineRequest, OutputKind

    engine = llm.engine
    params = SamplingParams(max_tokens=48, temperature=1.5, seed=11)
    req = engine.add_request(EngineRequest("The quick brown fox", params, output_kind=OutputKind.DELTA))
    pieces, tokens, final = [], [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.append(out.outputs[0].text)
            tokens.extend(out.outputs[0].token_ids)
            final = out if out.finished else final
    assert final is not None and len(tokens) == 48
    assert "".join(pieces) == llm.tokenizer.decode(tokens, skip_special_tokens=True)
    assert req.sequences[0].output_token_ids == tokens
