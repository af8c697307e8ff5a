"""The tool-call parsers without a server: every parser, streamed in any chunking, assembles to what
the finished output parses to (the stream never takes text back), and the parsed calls are what
``json.loads`` / ``ast`` of the written text say."""

from __future__ import annotations

import json

import pytest
from harness.examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.tools import ToolStream, parse_output, plan_tools

TOOLS = [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g"}}]
ARGS = {"x": [1, 'a \\ " } ] {', {"y": None}], "z": "ü"}
A = json.dumps(ARGS)
NOT_OFFERED = 'Hi <tool_call>{"name": "h", "arguments": {}}</tool_call>'
CUT_OFF = '<tool_call>{"name": "f", "arguments": {"x": 1'
CASES = {
    "hermes": [
        (
            f'Sure.\n<tool_call>{{"name": "f", "arguments": {A}}}</tool_call>\n<tool_call>{{"name": "g", "arguments": {{}}}}</tool_call>',
            "Sure.",
            [("f", ARGS), ("g", {})],
        ),
        ("a < b and <tool_ not a call", "a < b and <tool_ not a call", []),
        (
            '<tool_call>{"name": "f", "arguments": {"x": 1',
            '<tool_call>{"name": "f", "arguments": {"x": 1',
            [],
        ),  # cut off
        (f'<tool_call>{{"arguments": {A}, "name": "f"}}</tool_call>', None, [("f", ARGS)]),  # arguments first
        # A tool that was not offered is not called (OpenAI never does): its block is text.
        (NOT_OFFERED, NOT_OFFERED, []),
        (
            f'<tool_call>{{"name": "f", "arguments": {{}}}}</tool_call> <tool_call>{{"arguments": {A}, "name": "h"}}</tool_call>',
            f'<tool_call>{{"arguments": {A}, "name": "h"}}</tool_call>',
            [("f", {})],
        ),
        (
            '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
            [],
        ),
    ],
    "llama3_json": [
        (
            f'<|python_tag|>{{"name": "f", "parameters": {A}}}; {{"name": "g", "parameters": {{}}}}',
            None,
            [("f", ARGS), ("g", {})],
        ),
        ("The answer is {not json}", "The answer is {not json}", []),
        ('{"name": "h", "parameters": {}}', '{"name": "h", "parameters": {}}', []),
        (
            '{"name": "f", "parameters": {}}; {"name": "h", "parameters": {}}',
            '{"name": "h", "parameters": {}}',
            [("f", {})],
        ),
    ],
    "mistral": [
        (
            f'Ok [TOOL_CALLS][{{"name": "f", "arguments": {A}}}, {{"name": "g", "arguments": {{}}}}]',
            "Ok",
            [("f", ARGS), ("g", {})],
        ),
        ("[TOOL_CALL is not it", "[TOOL_CALL is not it", []),
        ('[TOOL_CALLS][{"name": "h", "arguments": {}}]', '[TOOL_CALLS][{"name": "h", "arguments": {}}]', []),
        (
            'Ok [TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "h", "arguments": {}}]',
            'Ok {"name": "h", "arguments": {}}]',
            [("f", {})],
        ),
    ],
    "pythonic": [
        ('[f(x=[1, "a"], z="ü"), g()]', None, [("f", {"x": [1, "a"], "z": "ü"}), ("g", {})]),
        ("[1, 2] is a list, not calls", "[1, 2] is a list, not calls", []),
        ("[f(), h(x=1)]", "[f(), h(x=1)]", []),  # a list naming a tool not offered is text as a whole
    ],
}
FLAT = [(parser, *case) for parser, cases in CASES.items() for case in cases]
# A stream cannot take back a call whose name and first arguments it already sent; a cut-off call is
# therefore only equal to the finished parse when it is finished (see test_finished_output).
STREAMED = [case for case in FLAT if case[1] != CUT_OFF]


def _plan(parser: str, **kw):
    return plan_tools(ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, **kw), parser)


def _stream(plan, pieces: list[str]):
    s = ToolStream(plan)
    outs = [s.delta(p, None) for p in pieces] + [s.delta("", "stop")]
    content = "".join((d or {}).get("content", "") for d, _ in outs)
    calls: dict[int, list[str]] = {}
    for d, _ in outs:
        for tc in (d or {}).get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls
                calls[tc["index"]] = [tc["function"]["name"], ""]
            calls[tc["index"]][1] += tc["function"].get("arguments", "")
    return content, [tuple(calls[k]) for k in sorted(calls)], outs[-1][1]


@pytest.mark.parametrize("parser,text,content,calls", FLAT)
def test_finished_output(parser, text, content, calls):
    got_content, got_calls = parse_output(_plan(parser), text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


@settings(max_examples=examples(60), deadline=None)
@given(case=st.sampled_from(STREAMED), cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=40))
def test_any_chunking_streams_the_same_answer(case, cuts):
    parser, text, content, calls = case
    pieces, i = [], 0
    for c in sorted(set(cuts)):
        if c < len(text):
            pieces.append(text[i:c])
            i = c
    pieces.append(text[i:])
    plan = _plan(parser)
    got_content, got_calls, reason = _stream(plan, pieces)
    assert [(n, json.loads(a)) for n, a in got_calls] == calls
    assert got_content.strip() == (content or "")
    assert reason == ("tool_calls" if calls else "stop")


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = CASES["hermes"][0][0]
    plan = _plan("hermes", parallel_tool_calls=False)
    assert [c.name for c in parse_output(plan, text)[1]] == ["f"]
    assert [n for n, _ in _stream(plan, list(text))[1]] == ["f"]


def test_text_is_held_back_only_while_it_could_open_a_call():
    s = ToolStream(_plan("hermes"))
    assert s.delta("Hello <tool", None)[0] == {"content": "Hello "}
    assert s.delta("box>", None)[0] == {"content": "<toolbox>"}  # not a call after all


@pytest.mark.parametrize(
    "parser,text",
    [
        ("llama3_json", '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": 1'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 1'),
    ],
)
def test_a_call_cut_off_after_a_complete_one_keeps_the_complete_one(parser, text):
    """The second call is cut off: the first call stands. Finished, the cut-off rest is text; a
    stream has already started the second as a call, keeps it as one and never sends it again as
    content (docs/openai-api.md)."""
    content, calls = parse_output(_plan(parser), text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {})]
    assert content == text[text.index('{"name": "g"') :]
    streamed_content, streamed_calls, _ = _stream(_plan(parser), list(text))
    assert streamed_calls[0] == ("f", "{}") and streamed_content == ""
