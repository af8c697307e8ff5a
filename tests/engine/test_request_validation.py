"""Requests that can never be served get a clear error at admission — never a hang."""

from __future__ import annotations

import pytest

from loraplex.engine import LLM, EngineConfig, InvalidRequestError, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    # 32 blocks x 4 tokens = 128 token slots; the watermark keeps 1 block free for admissions.
    return LLM(model=tiny_llama, max_num_seqs=4, block_size=4, num_kv_blocks=32, watermark=0.04, max_model_len=256)


def test_prompt_plus_max_tokens_beyond_max_model_len(llm):
    with pytest.raises(InvalidRequestError, match="maximum context length 256") as e:
        llm.generate([[5] * 200], SamplingParams(max_tokens=100))
    assert e.value.param == "max_tokens"


def test_request_larger_than_whole_kv_pool(llm):
    # 100 + 40 = 140 tokens = 35 blocks > 31 usable blocks: it could never run, even alone.
    with pytest.raises(InvalidRequestError, match="KV"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=40))
    # A request that exactly fits the usable pool is served.
    out = llm.generate([[5] * 100], SamplingParams(max_tokens=24, ignore_eos=True))
    assert len(out[0].token_ids) == 24


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt(llm, prompt):
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate([prompt], SamplingParams(max_tokens=4))


def test_token_ids_out_of_vocab(llm):
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(InvalidRequestError, match="token ids"):
        llm.generate([[1, vocab]], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError):
        llm.generate([[1, -3]], SamplingParams(max_tokens=4))


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"seed": "abc"}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_bad_sampling_values(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param


def test_failed_batch_leaves_nothing_running(llm):
    # The third prompt is invalid: generate() must refuse the whole call and leave no request behind.
    with pytest.raises(InvalidRequestError):
        llm.generate([[5, 6], [7, 8], []], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_engine_config_rejects_nonsense(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="batching"):
        EngineConfig(model=tiny_llama, batching="dynamic")
    with pytest.raises(ValueError, match="kernel_backend"):
        EngineConfig(model=tiny_llama, kernel_backend="cuda")
    with pytest.raises(ValueError, match="config.json"):
        EngineConfig(model=str(tmp_path))
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(model=tiny_llama, max_num_seqs=0)
