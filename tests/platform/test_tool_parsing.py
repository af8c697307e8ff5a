"""Tool-call plumbing without a server: plans from tool_choice, Hermes-format parsing for "auto",
and the streaming deltas, checked against json.loads of what a client would assemble."""

from __future__ import annotations

import json

import pytest

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.tools import ToolStream, parse_output, plan_tools, template_messages

TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    },
    {"type": "function", "function": {"name": "g"}},
]


def _req(**kw) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], **kw)


def test_plans():
    assert plan_tools(_req()).mode == "none"
    assert plan_tools(_req(tools=TOOLS)).mode == "auto"
    named = plan_tools(_req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}))
    assert named.mode == "named" and json.loads(named.spec[1]) == TOOLS[0]["function"]["parameters"]
    # required: the served format's own calls (hermes); a format without that form: a JSON array
    assert plan_tools(_req(tools=TOOLS, tool_choice="required")).spec[0] == "structural_tag"
    req = plan_tools(_req(tools=TOOLS, tool_choice="required"), "mistral")
    options = json.loads(req.spec[1])["items"]["anyOf"]
    assert [o["properties"]["name"]["const"] for o in options] == ["f", "g"]
    with pytest.raises(BadRequest, match="not in tools"):
        plan_tools(_req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "h"}}))
    with pytest.raises(BadRequest, match="needs tools"):
        plan_tools(_req(tool_choice="required"))


def test_auto_reads_hermes_tool_calls_and_keeps_other_text():
    plan = plan_tools(_req(tools=TOOLS))
    text = 'Let me check.\n<tool_call>{"name": "f", "arguments": {"x": 3}}</tool_call>\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = parse_output(plan, text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 3}), ("g", {})]
    assert parse_output(plan, "no call here") == ("no call here", [])
    assert parse_output(plan, "<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])


def test_named_stream_assembles_to_the_arguments():
    plan = plan_tools(_req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}))
    st = ToolStream(plan)
    parts = [st.delta(t, None) for t in ['{"x"', ": ", "42}"]] + [st.delta("", "stop")]
    deltas = [d for d, _ in parts if d]
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "f" and deltas[0]["tool_calls"][0]["id"]
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)
    assert json.loads(args) == {"x": 42} and parts[-1][1] == "stop"  # OpenAI: a named choice stops


def test_assistant_tool_calls_reach_a_template_without_tool_support_as_text():
    req = ChatRequest(
        model="m",
        messages=[
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "7"},
        ],
    )
    plain = template_messages(req, "{{ message['content'] }}")
    assert plain[1]["content"] == '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    aware = template_messages(req, "{% if message.tool_calls %}{% endif %}")
    assert aware[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert plain[2] == {"role": "tool", "content": "7", "tool_call_id": "call_1"}
