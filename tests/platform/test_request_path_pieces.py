"""The request path's pure pieces, without an engine or a server: a body's one conversion into the
engine's SamplingParams, max_tokens decided in one place (and OpenAI's context error), engine output -> per-choice deltas, the logprobs layouts, the wire models
and the body / chunk builders (rendering never submits: they take deltas and produce bodies)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from loraplex.engine.outputs import CompletionOutput, FinishReason, RequestOutput
from loraplex.engine.sampler import TokenLogprobs
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import wire
from loraplex.platform.inference.context_window import DEFAULT_MAX_TOKENS, ContextLengthExceeded, max_tokens_for
from loraplex.platform.inference.deltas import Delta, choice_deltas, is_abort, new_tokens, timeout_deltas
from loraplex.platform.inference.logprobs_format import LogprobsFormatter, concat
from loraplex.platform.inference.openai_schemas import MAX_SEED, ChatRequest, CompletionRequest
from loraplex.platform.inference.render import BodyBuilder, ChunkBuilder, Meta, Shape
from loraplex.platform.inference.tools import plan_tools

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tok(demo_model_dir):
    return AutoTokenizer.from_pretrained(str(demo_model_dir))


# -- body -> SamplingParams (one copy) ------------------------------------------------------------
def _completion_body(**kw) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **kw})


EVERY_FIELD = dict(
    temperature=0.5,
    top_p=0.9,
    n=2,
    stop=["a", "bc"],
    seed=7,
    logit_bias={"5": 3.0},
    top_k=4,
    min_p=0.1,
    min_tokens=1,
    stop_token_ids=[3],
    bad_words=["Paris"],
    allowed_token_ids=[1, 2, 3],
    include_stop_str_in_output=True,
    ignore_eos=True,
    repetition_penalty=1.2,
    presence_penalty=0.5,
    frequency_penalty=-0.5,
    logprobs=2,
    prompt_logprobs=1,
)


def test_a_body_becomes_the_engines_sampling_params_in_one_copy(tok):
    from loraplex.engine import SamplingParams, StructuredOutputSpec

    body = _completion_body(**EVERY_FIELD)
    p = body.to_sampling_params(tok, max_tokens=9, structured_output=("regex", "a+"))
    assert isinstance(p, SamplingParams)
    assert (p.max_tokens, p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (9, 2, 0.5, 0.9, 4, 0.1, 7)
    assert p.stop == ["a", "bc"] and p.stop_token_ids == [3] and p.logit_bias == {5: 3.0}
    assert p.allowed_token_ids == [1, 2, 3] and p.include_stop_str_in_output and p.ignore_eos
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert p.logprobs == 2 and p.prompt_logprobs == 1 and p.min_tokens == 1
    assert p.structured_output == StructuredOutputSpec("regex", "a+")
    # bad words: alone and after a space, as token ids of the real tokenizer
    assert tok.encode("Paris", add_special_tokens=False) in p.bad_words_token_ids
    assert tok.encode(" Paris", add_special_tokens=False) in p.bad_words_token_ids
    # Every engine field is set from the body: a field added to SamplingParams that the conversion
    # forgets keeps its default and fails here (speculative is the engine's own decision).
    default = SamplingParams()
    unset = [
        f.name
        for f in dataclasses.fields(SamplingParams)
        if getattr(p, f.name) == getattr(default, f.name) and f.name != "speculative"
    ]
    assert unset == []


def test_each_endpoint_names_its_logprobs_and_limits(tok):
    chat = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3}
    )
    assert chat.requested_max_tokens() is None  # chat's default: what is left of the context
    assert chat.to_sampling_params(tok, max_tokens=4, structured_output=None).logprobs == 3
    both = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 5}
    )
    assert (
        both.requested_max_tokens() == 5
        and both.to_sampling_params(tok, max_tokens=5, structured_output=None).logprobs is None
    )
    # completions: 16 by default (OpenAI); echo + logprobs asks the prompt's logprobs at the larger k
    assert _completion_body().requested_max_tokens() == 16
    echo = _completion_body(echo=True, logprobs=3, prompt_logprobs=1)
    assert echo.to_sampling_params(tok, max_tokens=4, structured_output=None).prompt_logprobs == 3


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"priority": 3}, "priority"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"logit_bias": {str(10**9): 1.0}}, "logit_bias"),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ],
)
def test_sampling_refusals_that_need_the_tokenizer_name_the_field(tok, fields, param):
    with pytest.raises(BadRequest) as e:
        _completion_body(**fields).check_sampling(tok)
    assert e.value.param == param and e.value.status_code == 400


@pytest.mark.parametrize(("fields", "param"), [({"seed": MAX_SEED + 1}, "seed"), ({"seed": -1}, "seed")])
def test_sampling_refusals_of_the_schema_name_the_field(fields, param):
    with pytest.raises(ValidationError) as e:
        _completion_body(**fields)
    assert e.value.errors()[0]["loc"] == (param,)


def test_the_engines_own_refusal_is_a_400_naming_its_field(tok):
    with pytest.raises(BadRequest) as e:  # min_tokens > max_tokens: only known once max_tokens is decided
        _completion_body(min_tokens=50).to_sampling_params(tok, max_tokens=4, structured_output=None)
    assert e.value.param == "min_tokens" and e.value.code == "invalid_value"


# -- max_tokens: decided in one place -------------------------------------------------------------
@pytest.mark.parametrize(
    ("requested", "prompt", "context", "expected"),
    [
        (None, 10, 100, 90),  # chat's default: what is left
        (5, 10, 100, 5),
        (90, 10, 100, 90),  # exactly fits
        (None, 99, 100, 1),
        (None, 10, None, DEFAULT_MAX_TOKENS),  # no engine to ask yet: the fixed default
        (7, 10, None, 7),
    ],
)
def test_max_tokens_for(requested, prompt, context, expected):
    assert max_tokens_for(requested, prompt, context, param="messages") == expected


@pytest.mark.parametrize(("requested", "prompt"), [(None, 100), (None, 150), (91, 10), (1, 100)])
def test_a_request_that_cannot_fit_gets_openais_context_error(requested, prompt):
    with pytest.raises(ContextLengthExceeded) as e:
        max_tokens_for(requested, prompt, 100, param="messages")
    err = e.value
    assert (err.status_code, err.code, err.param) == (400, "context_length_exceeded", "messages")
    assert err.message.startswith("This model's maximum context length is 100 tokens. However, ")
    assert f"{prompt} " in err.message  # the prompt's own count, as OpenAI states it


# -- engine output -> deltas --------------------------------------------------------------------
def _out(*comps: CompletionOutput, finished: bool = False, prompt_lps=None) -> RequestOutput:
    return RequestOutput("r", [1, 2], list(comps), finished, prompt_logprobs=prompt_lps)


def test_choice_deltas_one_per_choice_that_moved_and_each_ends_once():
    lp = TokenLogprobs(5, -0.5, [(5, -0.5)])
    done: set[int] = set()
    out = _out(
        CompletionOutput(0, [5], "a", logprobs=[lp]),
        CompletionOutput(1, [6], "", finish_reason=FinishReason.STOP),
        CompletionOutput(2, [7], ""),  # a token whose text is held back: nothing to send
    )
    assert new_tokens(out) == 3
    got = choice_deltas(out, done, delivered=3)
    assert [(d.index, d.text, d.finish_reason, d.logprobs) for d in got] == [(0, "a", None, [lp]), (1, "", "stop", [])]
    assert done == {1} and all(d.completion_tokens == 3 for d in got)
    # the engine reports the ended choice again: no second finish
    last = _out(
        CompletionOutput(0, [], "b", finish_reason=FinishReason.LENGTH),
        CompletionOutput(1, [], "", finish_reason=FinishReason.STOP),
        CompletionOutput(2, [], "c", finish_reason=FinishReason.STOP),
        finished=True,
        prompt_lps=["p"],
    )
    got = choice_deltas(last, done, delivered=5)
    assert [(d.index, d.text, d.finish_reason, d.prompt_logprobs) for d in got] == [
        (0, "b", "length", ["p"]),
        (2, "c", "stop", ["p"]),
    ]
    assert done == {0, 1, 2}


def test_timeout_closes_only_open_choices_and_abort_is_recognised():
    assert [(d.index, d.finish_reason) for d in timeout_deltas(3, {1}, 4)] == [(0, "length"), (2, "length")]
    assert timeout_deltas(2, {0, 1}, 4) == []
    aborted = _out(CompletionOutput(0, [], "", finish_reason=FinishReason.ABORT), finished=True)
    assert is_abort(aborted) and not is_abort(_out(CompletionOutput(0, [1], "x")))


# -- logprobs layouts ---------------------------------------------------------------------------
def test_completion_logprobs_offsets_follow_the_token_texts(tok):
    fmt = LogprobsFormatter(tok)
    ids = tok.encode("Hello world, again", add_special_tokens=False)
    lps = [TokenLogprobs(t, -float(i), [(t, -float(i))]) for i, t in enumerate(ids)]
    got = fmt.completion(lps, offset=3)
    assert "".join(got["tokens"]) == tok.decode(ids)
    assert got["text_offset"][0] == 3
    assert all(b - a == len(s) for a, b, s in zip(got["text_offset"], got["text_offset"][1:], got["tokens"]))
    # echoed prompt: the first token has no logprob and no top; the rest are the engine's, cut to k
    plps = [TokenLogprobs(t, -1.0, [(t, -1.0), (0, -2.0), (1, -3.0)], rank=1) for t in ids[1:]]
    echo = fmt.echoed_prompt(ids, plps, k=2)
    assert echo["token_logprobs"][0] is None and echo["top_logprobs"][0] is None
    assert len(echo["tokens"]) == len(ids) and echo["text_offset"][0] == 0
    assert all(len(t) <= 2 for t in echo["top_logprobs"][1:])
    both = concat(echo, got)
    assert both["tokens"] == echo["tokens"] + got["tokens"] and len(both["text_offset"]) == len(ids) * 2


def test_chat_logprobs_bytes_rebuild_a_split_utf8_character(tok):
    fmt = LogprobsFormatter(tok)
    ids = tok.encode("é😀", add_special_tokens=False)
    got = fmt.chat([TokenLogprobs(t, -0.1, []) for t in ids])
    assert bytes(b for e in got["content"] for b in e["bytes"]).decode("utf-8") == "é😀"
    assert got["refusal"] is None


def test_prompt_logprobs_layout(tok):
    fmt = LogprobsFormatter(tok)
    got = fmt.prompt([TokenLogprobs(9, -1.5, [(3, -0.1), (9, -1.5)], rank=2)], k=1)
    assert got is not None and got[0] is None
    assert set(got[1]) == {"9", "3"} and got[1]["9"]["rank"] == 2 and got[1]["3"]["rank"] == 1
    assert fmt.prompt(None, 1) is None


# -- wire models --------------------------------------------------------------------------------
def test_wire_models_omit_what_openai_omits_and_keep_its_nulls():
    m = wire.ChatMessage(content=None)
    assert m.dump() == {"role": "assistant", "content": None}
    body = wire.ChatCompletion(
        id="x",
        created=1,
        model="m",
        choices=[wire.ChatChoice(index=0, message=m, finish_reason="stop")],
        usage=wire.Usage.of(2, 3),
    )
    d = body.dump()
    assert "prompt_logprobs" not in d and d["choices"][0]["logprobs"] is None
    assert d["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    asked = wire.ChatCompletion(**{**body.__dict__, "prompt_logprobs": None})
    assert asked.dump()["prompt_logprobs"] is None  # asked for: present even when null
    first = wire.ToolCallDelta(
        index=0, id="call_1", type="function", function=wire.FunctionDelta(name="f", arguments="")
    )
    assert first.dump() == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    later = wire.ToolCallDelta(index=0, function=wire.FunctionDelta(arguments='{"a"'))
    assert later.dump() == {"index": 0, "function": {"arguments": '{"a"'}}
    assert wire.ChatDelta().dump() == {}


# -- body and chunk builders (rendering without an engine) --------------------------------------
def _meta(prompts: int = 1) -> Meta:
    return Meta("cmpl-1", 123, "bot", [[1, 2, 3]] * prompts)


def test_completion_body_numbers_choices_prompt_major_and_sums_usage(tok):
    shape = Shape(chat=False, n=2, stream=False, include_usage=False, logprobs=None, echo=["P0", "P1"])
    b = BodyBuilder(shape, _meta(2), LogprobsFormatter(tok))
    # prompt 1's deltas arrive first; each prompt's completion_tokens is its request's running total
    b.add(1, Delta("x", None, 1, index=1))
    b.add(0, Delta("a", None, 1, index=0))
    b.add(1, Delta("y", "stop", 2, index=1))
    b.add(1, Delta("z", "length", 3, index=0))
    b.add(0, Delta("b", "stop", 2, index=0))
    b.add(0, Delta("", "length", 2, index=1))
    d = json.loads(json.dumps(b.body().dump()))
    assert [(c["index"], c["text"], c["finish_reason"]) for c in d["choices"]] == [
        (0, "P0ab", "stop"),
        (1, "P0", "length"),
        (2, "P1z", "length"),
        (3, "P1xy", "stop"),
    ]
    assert d["object"] == "text_completion" and d["usage"]["completion_tokens"] == 5
    assert d["usage"]["prompt_tokens"] == 6 and all("prompt_logprobs" not in c for c in d["choices"])


def test_chat_chunks_stream_tool_calls_per_choice(tok):
    body = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        }
    )
    plan = plan_tools(body, "hermes")
    shape = Shape(chat=True, n=2, stream=True, include_usage=True, logprobs=None, tools=plan)
    cb = ChunkBuilder(shape, _meta(), LogprobsFormatter(tok))
    opening = [c.dump() for c in cb.opening()]
    assert [c["choices"][0]["delta"] for c in opening] == [{"role": "assistant", "content": ""}] * 2
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    chunks = []
    for i, piece in enumerate([call[:12], call[12:40], call[40:]]):
        for choice in (0, 1):
            text = piece if choice == 0 else ("Hello"[i * 2 : i * 2 + 2])
            reason = "stop" if i == 2 else None
            c = cb.chunk(0, Delta(text, reason, 2 * (i + 1), index=choice))
            if c is not None:
                chunks.append(c.dump())
    by_choice: dict[int, list] = {0: [], 1: []}
    for c in chunks:
        by_choice[c["choices"][0]["index"]].append(c["choices"][0])
    args = "".join(
        tc["function"].get("arguments", "") for ch in by_choice[0] for tc in ch["delta"].get("tool_calls", [])
    )
    assert json.loads(args) == {"city": "Paris"}
    names = [tc["function"]["name"] for ch in by_choice[0] for tc in ch["delta"].get("tool_calls", []) if "id" in tc]
    assert names == ["get_weather"] and by_choice[0][-1]["finish_reason"] == "tool_calls"
    assert not any("content" in ch["delta"] for ch in by_choice[0])  # the call's text is never content
    assert "".join(ch["delta"].get("content", "") for ch in by_choice[1]) == "Hello"
    assert by_choice[1][-1]["finish_reason"] == "stop"
    usage = cb.usage_chunk().dump()
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}
    assert usage["object"] == "chat.completion.chunk"
