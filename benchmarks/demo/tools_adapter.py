"""How well the ``tools`` demo adapter does the agent turns it was trained for, on HELD-OUT
phrasings, cities and numbers (none is in platform/demo/tool_dataset.py): the first call (right
tool, right arguments, or none when none fits; handoffs), and the turn after a tool result (a
plain-text answer from the result, not another call; the second call of a two-city question; the
``final_result`` output tool). Greedy, in-process (``LLM``), prompts rendered by the server's demo
chat template; calls read by the server's default parser (hermes). No grammar: this measures the
adapter itself.

The first table's ``call`` total (24) stays comparable with earlier runs; the second splits it
(``first`` call of a question, ``handoff``, the handed-to agent's call ``handoff_next``,
``second_call``, ``final_result``) and adds rows outside it (``fw_*``: the tools in the exact shapes
openai-agents and pydantic-ai send; ``schema_*``: tools beside a ``response_format`` JSON schema,
the call first, then the schema's JSON with the result's values).

    python -m benchmarks.demo.tools_adapter                       # the adapter `loraplex demo adapters` trains
    python -m benchmarks.demo.tools_adapter --adapter old=PATH --adapter new=PATH   # compare folders

~1-2 min on 2 cores (a few dozen short generations per adapter) after the adapter is trained.

The record of the data and recipe, measured here (2-core AMD EPYC Zen 4, avx512_bf16, no AMX;
2026-12-07; seed 0 unless said). Columns: call total, plain text for a no-tool question, a plain
answer after a result; then first / handoff / handoff_next / second_call / final_result (no
grammar); then the same final_result turns as pydantic-ai asks them, under ``required``
(``req_final_result`` / ``req_fw_final_result``); training CPU s; and tests/demo/test_agent_examples.py
(7 framework examples against ``loraplex serve``, xfails run):

| data (conversations) | steps | call | text | after | first, handoff, h_next, 2nd, final | req final | CPU s | examples |
|---|---|---|---|---|---|---|---|---|
| the previous data (112) | 30 | 8/24 | 3/3 | 16/16 | 8/14, 0/3, 0/3, 0/2, 0/2 | - | 221 | 5/7 (d) |
| the same | 60 | 13/24 | 3/3 | 16/16 | 10/14, 3/3, 0/3, 0/2, 0/2 | - | 320 | - |
| + loop_endings (130) | 60 | 16/24 | 3/3 | 16/16 | 10/14, 3/3, 3/3, 0/2, 0/2 | - | 371 | - |
| + 50 cities | 60 | 16/24 | 3/3 | 12/16 | 10/14, 3/3, 2/3, 0/2, 1/2 | - | 349 | - |
| + 50 cities | 90 | 16/24 | 3/3 | 16/16 | 11/14, 3/3, 2/3, 0/2, 0/2 | 1/2, 2/2 | 465 | 6/7 (a) |
| + arithmetic (146) | 90 | 16/24 | 3/3 | 12/16 | 10/14, 3/3, 2/3, 0/2, 1/2 | 1/2, 2/2 | 476 | 7/7 |
| + results without the city | 60 | 19/24 | 3/3 | 8/16 | 11/14, 3/3, 3/3, 0/2, 2/2 | 2/2, 2/2 | 468 | 7/7 |
| the same | 90 | 16/24 | 3/3 | 13/16 | 10/14, 3/3, 2/3, 0/2, 1/2 | 1/2, 2/2 | 497 | - |
| the same, seed 1 | 90 | 17/24 | 3/3 | 7/16 | 10/14, 3/3, 2/3, 0/2, 2/2 | 2/2, 2/2 | 469 | 7/7 |
| **+ minimal pairs (160): shipped** | **60** | 14/24 | 3/3 | **16/16** | 11/14, 3/3, 0/3, 0/2, 0/2 | **2/2, 2/2** | 388 | **7/7** |
| the same | 90 | 16/24 | 3/3 | 14/16 | 10/14, 3/3, 2/3, 0/2, 1/2 | 2/2, 2/2 | 538 | 7/7 |
| the same + decision weight 4 + own turns only (b) | 60 | 13/24 | 3/3 | 16/16 | 10/14, 0/3, 2/3, 0/2, 1/2 | 1/2, 2/2 | 455 | 7/7 |
| the same + own turns only (b) | 60 | 14/24 | 3/3 | 16/16 | 10/14, 3/3, 0/3, 0/2, 1/2 | 2/2, 2/2 | 450 | 5/7 (c) |

(a) LlamaIndex: multiply(7, 8) called, then "5 times 8 is 48.": the arithmetic conversations came
next. (b) the trainer options of branch adapter36 (not merged: no gain). (c) LangChain and the
openai-agents tool example: the loop ended, but "It is sunny and sunny in Paris." without the
result's 18. (d) the last suite's xfails: the handoff (no get_weather call) and pydantic-ai
(a loop to its 50-request limit); LlamaIndex passed on this CPU (an xpass).

What decides the mix: "after" (a plain answer after a result, i.e. the loop ends) is the row every
framework needs, and it swings from 16/16 to 7/16 with the share of turns after a result that are
calls; the minimal pairs (final_result offered or not, the same conversation) hold it at 16/16 at
60 steps. What is still weak, measured: new city names are misspelt ("Lima" -> "Limba"/"LIMA",
"Mumbai" -> "Bombai": one token in the question, several in the call's JSON); without a grammar
the handed-to agent answers instead of calling (0/3, 3/3 under ``required``) and the second city's
call repeats the first city (0/2); pydantic-ai's final_result needs ``required``, which pydantic-ai
sends. Runs of the same data differ by seed and steps by several of 16 on "after": one run is
one sample, and the examples are the bar.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.lib.real_text import CACHE, demo_model_dir
from benchmarks.lib.workload import print_table, write_json
from loraplex.platform.demo.tool_dataset import (
    ADD,
    FINAL_RESULT,
    MATH_AGENT,
    MULTIPLY,
    TIME,
    WEATHER,
    WEATHER_AGENT,
)

CITIES = ["Lisbon", "Oslo", "Seoul", "Lima", "Nairobi", "Dublin", "Vienna", "Mumbai"]
WEATHER_ASKS = [
    "Could you check the weather for {}?",
    "Is it warm in {} at the moment?",
    "Any rain expected in {} today?",
    "How's the weather over in {}?",
]
TIME_ASKS = ["What's the current time over in {}?", "I need the local time in {}."]
NO_TOOL = ["What is the capital of Canada?", "Who wrote Hamlet?", "How many legs does a spider have?"]
TRIAGE = "You are a triage agent. Hand off to the right agent."
# The ``call`` total's parts, then the extra rows (framework_cases).
ROWS = ["first", "handoff", "handoff_next", "second_call", "final_result"]
ROWS += [
    "fw_first",
    "fw_handoff",
    "fw_handoff_next",
    "fw_pyd_first",
    "fw_final_result",
    "schema_first",
    "schema_answer",
]
# The turns after a result that must be calls, again under ``tool_choice: "required"``: the server's
# grammar then forces the call's opening (``<tool_call>\n{"name": "``), so what is left to the adapter
# is WHICH tool and its arguments (pydantic-ai asks ``required`` for its final_result turn).
FORCED_ROWS = ["handoff_next", "second_call", "final_result", "fw_handoff_next", "fw_final_result"]
FORCED_PREFIX = '<tool_call>\n{"name": "'
ROWS += ["req_" + row for row in FORCED_ROWS]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _result(call_id: str, content: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def cases() -> list[dict[str, Any]]:
    """Each: messages, tools, kind (``call`` / ``text`` / ``after_result``) and what is expected."""
    out: list[dict[str, Any]] = []
    for i, city in enumerate(CITIES):
        ask = WEATHER_ASKS[i % len(WEATHER_ASKS)].format(city)
        tools = [WEATHER, TIME] if i % 2 else [MULTIPLY, WEATHER]
        out.append(
            dict(kind="call", row="first", messages=[_user(ask)], tools=tools, expect=("get_weather", {"city": city}))
        )
        degrees = 11 + i
        result = {"city": city, "temperature_c": degrees, "conditions": "foggy"}
        history = [_user(ask), _call("c1", "get_weather", {"city": city}), _result("c1", result)]
        out.append(dict(kind="after_result", messages=history, tools=tools, expect=str(degrees)))
    for i, city in enumerate(CITIES[:4]):
        ask = TIME_ASKS[i % len(TIME_ASKS)].format(city)
        out.append(
            dict(
                kind="call",
                row="first",
                messages=[_user(ask)],
                tools=[WEATHER, TIME],
                expect=("get_time", {"city": city}),
            )
        )
        history = [_user(ask), _call("c1", "get_time", {"city": city}), _result("c1", {"time": f"0{i + 1}:45"})]
        out.append(dict(kind="after_result", messages=history, tools=[WEATHER, TIME], expect=f"0{i + 1}:45"))
    for a, b in [(7, 8), (12, 30)]:
        name, fn = ("multiply", MULTIPLY) if a == 7 else ("add", ADD)
        ask = f"Compute {a} times {b}." if name == "multiply" else f"What's {a} plus {b}?"
        value = a * b if name == "multiply" else a + b
        out.append(
            dict(kind="call", row="first", messages=[_user(ask)], tools=[fn, WEATHER], expect=(name, {"a": a, "b": b}))
        )
        history = [_user(ask), _call("c1", name, {"a": a, "b": b}), _result("c1", str(value))]
        out.append(dict(kind="after_result", messages=history, tools=[fn, WEATHER], expect=str(value)))
    for question in NO_TOOL:
        out.append(dict(kind="text", messages=[_user(question)], tools=[WEATHER, TIME], expect=None))
    # Handoff, then the agent handed to calls its tool.
    for city in CITIES[4:7]:
        ask = f"Will it be windy in {city} today?"
        system = {"role": "system", "content": TRIAGE}
        out.append(
            dict(
                kind="call",
                row="handoff",
                messages=[system, _user(ask)],
                tools=[WEATHER_AGENT, MATH_AGENT],
                expect=("transfer_to_weather_agent", {}),
            )
        )
        history = [
            {"role": "system", "content": "You are the weather agent. Use your tool."},
            _user(ask),
            _call("h1", "transfer_to_weather_agent", {}),
            _result("h1", {"assistant": "Weather agent"}),
        ]
        out.append(
            dict(
                kind="call",
                row="handoff_next",
                messages=history,
                tools=[WEATHER],
                expect=("get_weather", {"city": city}),
            )
        )
    # Two cities: the second call after the first result, then the answer.
    for a, b in [("Oslo", "Lima"), ("Dublin", "Seoul")]:
        ask = f"What's the weather in {a} and in {b}?"
        first = [_user(ask), _call("a", "get_weather", {"city": a}), _result("a", {"temperature_c": 4})]
        out.append(
            dict(kind="call", row="second_call", messages=first, tools=[WEATHER], expect=("get_weather", {"city": b}))
        )
        both = first + [_call("b", "get_weather", {"city": b}), _result("b", {"temperature_c": 23})]
        out.append(dict(kind="after_result", messages=both, tools=[WEATHER], expect="23"))
    # pydantic-ai's structured result: the output tool after the result.
    for city in CITIES[:2]:
        history = [_user(f"Weather report for {city}, please."), _call("s", "get_weather", {"city": city})]
        history.append(_result("s", {"city": city, "temperature_c": 17, "conditions": "clear"}))
        expect = ("final_result", {"city": city, "temperature_c": 17})
        out.append(
            dict(kind="call", row="final_result", messages=history, tools=[WEATHER, FINAL_RESULT], expect=expect)
        )
    return out + framework_cases()


# The tools exactly as the frameworks send them (recorded from examples/agents' requests).
AGENTS_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "properties": {"city": {"title": "City", "type": "string"}},
            "required": ["city"],
            "title": "get_weather_args",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}
AGENTS_HANDOFF = {
    "type": "function",
    "function": {
        "name": "transfer_to_weather_agent",
        "description": "Handoff to the Weather agent agent to handle the request. ",
        "parameters": {"additionalProperties": False, "type": "object", "properties": {}, "required": []},
        "strict": True,
    },
}
PYDANTIC_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "additionalProperties": False,
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "type": "object",
        },
        "strict": True,
    },
}
PYDANTIC_FINAL_RESULT = {
    "type": "function",
    "function": {
        "name": "final_result",
        "description": "The final response which ends this conversation",
        "parameters": {
            "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
            "required": ["city", "temperature_c"],
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def framework_cases() -> list[dict[str, Any]]:
    """Extra rows (not in the ``call`` total, which stays comparable with earlier runs): the tools
    in the exact shapes openai-agents and pydantic-ai send (recorded from their requests), with
    held-out cities and phrasings: a single tool, the handoff and the handed-to agent's call, and
    pydantic-ai's real tool then ``final_result`` after its result."""
    out: list[dict[str, Any]] = []
    helpful = {"role": "system", "content": "You are a helpful assistant."}
    for i, city in enumerate(CITIES[::2]):
        ask = WEATHER_ASKS[(i + 1) % len(WEATHER_ASKS)].format(city)
        weather = AGENTS_WEATHER
        out.append(
            dict(
                kind="call",
                row="fw_first",
                extra=True,
                messages=[helpful, _user(ask)],
                tools=[weather],
                expect=("get_weather", {"city": city}),
            )
        )
    for city in CITIES[1::3]:
        ask = f"Will it be windy in {city} today?"
        system = {"role": "system", "content": TRIAGE}
        transfer = AGENTS_HANDOFF
        expect: tuple[str, dict[str, Any]] = ("transfer_to_weather_agent", {})
        out.append(
            dict(
                kind="call",
                row="fw_handoff",
                extra=True,
                messages=[system, _user(ask)],
                tools=[transfer],
                expect=expect,
            )
        )
        history = [
            {"role": "system", "content": "You are the weather agent. Use your tool."},
            _user(ask),
            _call("h1", "transfer_to_weather_agent", {}),
            _result("h1", {"assistant": "Weather agent"}),
        ]
        weather = AGENTS_WEATHER
        expect = ("get_weather", {"city": city})
        out.append(
            dict(kind="call", row="fw_handoff_next", extra=True, messages=history, tools=[weather], expect=expect)
        )
    for i, city in enumerate(CITIES[2::3]):
        report = {"role": "system", "content": "Report the weather."}
        tools = [PYDANTIC_WEATHER, PYDANTIC_FINAL_RESULT]
        ask = _user(WEATHER_ASKS[i % len(WEATHER_ASKS)].format(city))
        out.append(
            dict(
                kind="call",
                row="fw_pyd_first",
                extra=True,
                messages=[report, ask],
                tools=tools,
                expect=("get_weather", {"city": city}),
            )
        )
        result = {
            "role": "tool",
            "tool_call_id": "s",
            "content": json.dumps({"city": city, "temperature_c": 9 + i, "conditions": "hazy"}, separators=(",", ":")),
        }
        history = [report, ask, _call("s", "get_weather", {"city": city}), result]
        expect = ("final_result", {"city": city, "temperature_c": 9 + i})
        out.append(dict(kind="call", row="fw_final_result", extra=True, messages=history, tools=tools, expect=expect))
    # Tools beside a response_format JSON schema: the call first, then the schema's JSON from the result.
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
        "required": ["city", "temperature_c"],
    }
    for i, city in enumerate(CITIES[3::2]):
        ask = _user(WEATHER_ASKS[(i + 2) % len(WEATHER_ASKS)].format(city))
        tools = [WEATHER, TIME] if i % 2 else [WEATHER]
        expect = ("get_weather", {"city": city})
        out.append(
            dict(kind="call", row="schema_first", extra=True, messages=[ask], tools=tools, schema=schema, expect=expect)
        )
        history = [ask, _call("j", "get_weather", {"city": city})]
        history.append(_result("j", {"city": city, "temperature_c": 30 + i, "conditions": "humid"}))
        answer = {"city": city, "temperature_c": 30 + i}
        out.append(
            dict(
                kind="json",
                row="schema_answer",
                extra=True,
                messages=history,
                tools=tools,
                schema=schema,
                expect=answer,
            )
        )
    return out


def _json(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text  # a malformed call: never equal to an expected dict


def score(llm, adapter: str, tokenizer) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from loraplex.engine import SamplingParams
    from loraplex.platform.demo.encode import prompt_text
    from loraplex.platform.inference.tool_parsers import get_parser

    todo = cases()
    prompts = [
        prompt_text(
            tokenizer,
            (c["messages"], c["tools"], "") if "schema" not in c else (c["messages"], c["tools"], "", c["schema"]),
        )
        for c in todo
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0), adapters=[adapter] * len(todo))
    parser = get_parser("hermes")
    rows, tally = [], {k: [0, 0] for k in ("call", "text", "after_result", "after_result_value")}
    for case, out in zip(todo, outs, strict=True):
        calls = [(c.name, _json(c.args)) for c in parser.scan(out.text, final=True).calls]
        if case["kind"] == "call":
            ok = calls[:1] == [case["expect"]]
        elif case["kind"] == "json":  # the schema's JSON, with the result's values
            ok = not calls and _json(out.text.strip()) == case["expect"]
        else:  # text, after_result: plain text, no call
            ok = not calls and "<tool_call>" not in out.text
        if not case.get("extra"):
            tally[case["kind"]][0] += ok
            tally[case["kind"]][1] += 1
        if case["kind"] == "after_result":
            tally["after_result_value"][0] += ok and case["expect"] in out.text
            tally["after_result_value"][1] += 1
        if "row" in case:
            tally.setdefault(case["row"], [0, 0])
            tally[case["row"]][0] += ok
            tally[case["row"]][1] += 1
        rows.append({"kind": case.get("row", case["kind"]), "ok": ok, "text": out.text})
    forced = [(c, p) for c, p in zip(todo, prompts, strict=True) if c.get("row") in FORCED_ROWS]
    outs = llm.generate(
        [p + FORCED_PREFIX for _, p in forced],
        SamplingParams(max_tokens=48, temperature=0),
        adapters=[adapter] * len(forced),
    )
    for (case, _), out in zip(forced, outs, strict=True):
        name, arguments = case["expect"]
        calls = [(c.name, _json(c.args)) for c in parser.scan(FORCED_PREFIX + out.text, final=True).calls]
        ok = calls[:1] == [(name, arguments)]
        row = "req_" + case["row"]
        tally.setdefault(row, [0, 0])
        tally[row][0] += ok
        tally[row][1] += 1
        rows.append({"kind": row, "ok": ok, "text": FORCED_PREFIX + out.text})
    summary = {f"{k}": f"{v[0]}/{v[1]}" for k, v in tally.items()}
    return summary, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", action="append", default=[], help="NAME=PEFT folder (repeatable)")
    ap.add_argument("--show", action="store_true", help="print every generation")
    args = ap.parse_args()
    model_dir = demo_model_dir()
    adapters = dict(a.split("=", 1) for a in args.adapter)
    if not adapters:
        from loraplex.platform.demo.adapters import train_demo_adapters

        adapters = {"tools": str(train_demo_adapters(model_dir, CACHE / "demo-adapters", print, ["tools"])["tools"])}
    from loraplex.engine import LLM

    llm = LLM(model=str(model_dir))
    table, detail = [], {}
    for name, path in adapters.items():
        llm.add_adapter(name, str(Path(path)))
        summary, rows = score(llm, name, llm.tokenizer)
        table.append({"adapter": name, **summary})
        detail[name] = rows
        if args.show:
            for r in rows:
                print(f"[{name}] {r['kind']:<13} {'ok ' if r['ok'] else 'BAD'} {r['text']!r}")
    print_table(table, ["adapter", "call", "text", "after_result", "after_result_value"])
    for part in (
        ROWS[:5],
        [r for r in ROWS[5:] if not r.startswith("req_")],
        [r for r in ROWS if r.startswith("req_")],
    ):
        print_table(table, ["adapter", *part])
    print("wrote", write_json("demo_tools_adapter", {"adapters": adapters, "summary": table, "rows": detail}))


if __name__ == "__main__":
    main()
