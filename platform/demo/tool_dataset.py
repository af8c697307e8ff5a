"""The built-in training data of the ``tools`` demo adapter, written for loraplex: whole agent turns,
as agent frameworks send them. With tools offered in the system prompt (the demo chat template):

- call the tool that fits (among several offered) as a Hermes ``<tool_call>`` block, or answer in
  plain text when none fits;
- after a ``<tool_response>`` turn, answer in plain text from the result (the turn that ends an
  agent's loop: without it the adapter calls the tool again until the framework's turn limit);
- hand off (``transfer_to_*`` tools, as openai-agents names them) and, as the agent handed to,
  continue with its own tool;
- two calls (two cities, or weather and time), each after the previous result, then one answer;
- a structured result through an output tool (``final_result``, as pydantic-ai names it) after the
  tool's result.

The tools are offered in the shapes the frameworks send (openai-agents' strict schemas with titles,
pydantic-ai's, LangChain's, LlamaIndex's signature descriptions; measured by recording their
requests) and the results come back as they return them (spaced or compact JSON, plain strings).
Words are in platform/demo/tool_phrasings.py. Every assistant turn of a conversation is a training
target (platform/demo/encode.py). Cities, numbers and phrasings the tests and
benchmarks/demo/tools_adapter.py ask about are NOT in here.
"""

from __future__ import annotations

import json
import random
from typing import Any

from loraplex.platform.demo.chat_template import DEFAULT_SYSTEM, tool_call_text
from loraplex.platform.demo.tool_phrasings import (
    CITIES,
    CONDITIONS,
    MATH_ASKS,
    SYSTEMS,
    TEXT_ANSWERS,
    TIME_ASKS,
    WEATHER_ASKS,
)

Params = dict[str, tuple[str, str]]
STYLES = ["plain", "agents", "pydantic", "langchain", "llamaindex"]


def _tool(name: str, description: str, params: Params, style: str = "plain") -> dict[str, Any]:
    """A function tool as a framework sends it: ``plain`` (the README's), ``agents`` (openai-agents:
    strict, titles), ``pydantic`` (pydantic-ai), ``langchain``, ``llamaindex`` (the signature in the
    description)."""
    required = list(params)
    if style == "plain":
        props = {p: {"type": t, "description": d} for p, (t, d) in params.items()}
        schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    if style in ("agents", "llamaindex"):
        props = {p: {"title": p.capitalize(), "type": t} for p, (t, _d) in params.items()}
        schema = {"properties": props, "required": required, "type": "object", "additionalProperties": False}
        if style == "agents":
            schema = {"properties": props, "required": required, "title": f"{name}_args", "type": "object"}
            schema["additionalProperties"] = False
        else:
            signature = ", ".join(f"{p}: 'float'" if t == "number" else f"{p}: 'str'" for p, (t, _d) in params.items())
            ret = "'float'" if all(t == "number" for t, _d in params.values()) else "'str'"
            description = f"{name}({signature}) -> {ret}\n{description.rstrip('.')}"
        function = {"name": name, "description": description, "parameters": schema, "strict": style == "agents"}
        return {"type": "function", "function": function}
    props = {p: {"type": t} for p, (t, _d) in params.items()}
    if style == "pydantic":
        schema = {"additionalProperties": False, "properties": props, "required": required, "type": "object"}
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": schema, "strict": True},
        }
    schema = {"properties": props, "required": required, "type": "object"}  # langchain
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def handoff(agent: str, style: str = "plain") -> dict[str, Any]:
    """A handoff tool as openai-agents offers it (no arguments; ``agents``: exactly its wording)."""
    name = "transfer_to_" + agent.lower().replace(" ", "_")
    schema: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    if style == "plain":
        function = {"name": name, "description": f"Handoff to the {agent} agent to handle the request. "}
        return {"type": "function", "function": {**function, "parameters": schema}}
    schema = {"additionalProperties": False, "type": "object", "properties": {}, "required": []}
    function = {"name": name, "description": f"Handoff to the {agent} agent to handle the request. "}
    return {"type": "function", "function": {**function, "parameters": schema, "strict": True}}


_CITY: Params = {"city": ("string", "The city name")}
_AB: Params = {"a": ("number", "first"), "b": ("number", "second")}
_DESCRIPTIONS = {
    "get_weather": ("Get the current weather in a city", _CITY),
    "get_time": ("Get the current local time in a city", _CITY),
    "multiply": ("Multiply two numbers", _AB),
    "add": ("Add two numbers", _AB),
}


def tool(name: str, style: str = "plain") -> dict[str, Any]:
    description, params = _DESCRIPTIONS[name]
    return _tool(name, description if style == "plain" else description + ".", params, style)


# The README's tool is get_weather with a `city` argument; the others are there so the adapter
# learns to choose by what the question asks, not to call whatever is offered.
WEATHER, TIME, MULTIPLY, ADD = (tool(n) for n in ("get_weather", "get_time", "multiply", "add"))
WEATHER_AGENT, MATH_AGENT = handoff("Weather agent"), handoff("Math agent")


def final_result(fields: dict[str, str], style: str = "pydantic") -> dict[str, Any]:
    """pydantic-ai's output tool for a result model with these fields (name -> JSON type)."""
    props = {f: {"type": t} for f, t in fields.items()}
    schema: dict[str, Any] = {"properties": props, "required": list(fields), "type": "object"}
    function: dict[str, Any] = {
        "name": "final_result",
        "description": "The final response which ends this conversation",
    }
    if style == "pydantic":
        schema["additionalProperties"] = False
        return {"type": "function", "function": {**function, "parameters": schema, "strict": True}}
    return {"type": "function", "function": {**function, "parameters": schema}}


FINAL_RESULT = final_result({"city": "string", "temperature_c": "integer"}, style="plain")

Messages = list[dict[str, Any]]
# (messages, tools, answer) or, for a request with a ``response_format`` JSON schema beside the
# tools, (messages, tools, answer, schema)
Example = tuple[Messages, Messages | None, str] | tuple[Messages, Messages | None, str, dict[str, Any]]


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _result(call_id: str, content: Any, compact: bool = False) -> dict[str, Any]:
    if isinstance(content, str):
        text = content
    else:
        text = json.dumps(content, ensure_ascii=False, separators=(",", ":") if compact else None)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _offer(rng: random.Random, needed: list[str], style: str, extra: int | None = None) -> list[dict[str, Any]]:
    """The needed tools plus up to one other (two when none is needed), in a random order."""
    others = [n for n in _DESCRIPTIONS if n not in needed]
    names = needed + rng.sample(
        others, extra if extra is not None else rng.randint(0 if needed else 1, 1 if needed else 2)
    )
    rng.shuffle(names)
    return [tool(n, style) for n in names]


def _start(rng: random.Random, system: str | None = None) -> list[dict[str, Any]]:
    system = system if system is not None else rng.choice(SYSTEMS)
    return [] if system is None else [{"role": "system", "content": system}]


def _weather(i: int, city: str) -> tuple[dict[str, Any] | str, str]:
    """A weather result (JSON or a framework's plain string) and the answer written from it."""
    degrees, cond = -4 + (i * 7) % 38, CONDITIONS[i % len(CONDITIONS)]
    if degrees in (4, 11, 12, 13, 14, 15, 16, 17, 18, 23):  # the held-out results' numbers
        degrees += 20
    if i % 4 == 3:
        return f"{cond.capitalize()}, {degrees} °C", f"It is {cond} and {degrees} °C in {city}."
    answer = f"It is {degrees} °C and {cond} in {city}." if i % 2 else f"In {city} it is {cond}, {degrees} °C."
    return {"city": city, "temperature_c": degrees, "conditions": cond}, answer


def _time(i: int, city: str) -> tuple[dict[str, Any], str]:
    clock = f"{(7 + 5 * i) % 24:02d}:{(13 * i + 2) % 60:02d}"
    return {"city": city, "time": clock}, f"It is {clock} in {city}."


def _number(value: float, style: str) -> str:
    return f"{float(value)}" if style == "llamaindex" else str(value)


def examples(seed: int = 0) -> list[Example]:
    """(messages, tools, answer) conversations; deterministic."""
    rng = random.Random(seed)
    out: list[Example] = []
    # One call, its result, the answer (and so also the call alone: the call turn is a target too).
    for i in range(36):
        city, ask, style = CITIES[(i * 7) % len(CITIES)], WEATHER_ASKS[i % len(WEATHER_ASKS)], STYLES[i % 4]
        result, answer = _weather(i, city)
        messages = _start(rng) + [_user(ask.format(city)), _call(f"call_w{i}", "get_weather", {"city": city})]
        messages.append(_result(f"call_w{i}", result, compact=style == "pydantic"))
        out.append((messages, _offer(rng, ["get_weather"], style), answer))
    for i in range(12):  # the weather tool offered too: choose by the question
        city, ask, style = CITIES[(i * 11 + 3) % len(CITIES)], TIME_ASKS[i % len(TIME_ASKS)], STYLES[(i + 1) % 4]
        result, answer = _time(i, city)
        messages = _start(rng) + [_user(ask.format(city)), _call(f"call_t{i}", "get_time", {"city": city})]
        out.append(
            (messages + [_result(f"call_t{i}", result)], _offer(rng, ["get_time", "get_weather"], style, 0), answer)
        )
    for i in range(12):
        ask, name = MATH_ASKS[i % len(MATH_ASKS)]
        a, b = 3 + (i * 5) % 23, 2 + (i * 3) % 13
        value = a * b if name == "multiply" else a + b
        word = "times" if name == "multiply" else "plus"
        style = ["plain", "llamaindex", "langchain", "agents"][i % 4]
        messages = _start(rng) + [_user(ask.format(a, b)), _call(f"call_m{i}", name, {"a": a, "b": b})]
        other = "add" if name == "multiply" else "multiply"
        needed = [name, other] if style == "llamaindex" else [name]
        tools = _offer(rng, needed, style, 0 if style == "llamaindex" else None)
        out.append((messages + [_result(f"call_m{i}", _number(value, style))], tools, f"{a} {word} {b} is {value}."))
    # No tool fits: a plain answer.
    for i, (question, answer) in enumerate(TEXT_ANSWERS[::2] + TEXT_ANSWERS[1:8:2]):
        out.append((_start(rng) + [_user(question)], _offer(rng, [], STYLES[i % 4]), answer))
    # The turns after a result that are NOT a text answer are the rare ones (a second call, the
    # handed-to agent's call, final_result, the schema's JSON): they are listed twice. A repeat
    # costs training steps only (train.py runs the frozen layers once per distinct conversation).
    rare = _two_calls(rng) + _handoffs(rng) + _structured(rng) + _with_schema(rng)
    return out + rare + [ex for ex in rare if not _is_triage(ex)]


def _is_triage(example: Example) -> bool:
    """A triage agent's first turn (its handoff call or its own answer): not rare."""
    return example[0][0]["content"] in TRIAGES and len(example[0]) == 2


def _two_calls(rng: random.Random) -> list[Example]:
    """Two calls, each after the previous result, then one answer."""
    out: list[Example] = []
    for i in range(8):
        first, second = CITIES[(i * 5 + 2) % len(CITIES)], CITIES[(i * 5 + 31) % len(CITIES)]
        (ra, _), (rb, _) = _weather(i + 5, first), _weather(i + 9, second)
        ask = [
            "What's the weather in {} and in {}?",
            "Compare the weather in {} and {}.",
            "Is it warmer in {} or in {}?",
            "How is the weather in {} and {}?",
        ][i % 4]
        style = STYLES[i % 4]
        messages = _start(rng) + [
            _user(ask.format(first, second)),
            _call(f"call_a{i}", "get_weather", {"city": first}),
            _result(f"call_a{i}", ra, compact=style == "pydantic"),
            _call(f"call_b{i}", "get_weather", {"city": second}),
            _result(f"call_b{i}", rb, compact=style == "pydantic"),
        ]
        answer = f"It is {_degrees(ra)} °C in {first} and {_degrees(rb)} °C in {second}."
        out.append((messages, _offer(rng, ["get_weather"], style), answer))
    for i in range(2):
        city = CITIES[(i * 13 + 6) % len(CITIES)]
        (rw, _), (rt, _) = _weather(i + 2, city), _time(i + 3, city)
        messages = _start(rng) + [
            _user(f"What is the weather and the time in {city}?"),
            _call(f"call_c{i}", "get_weather", {"city": city}),
            _result(f"call_c{i}", rw),
            _call(f"call_d{i}", "get_time", {"city": city}),
            _result(f"call_d{i}", rt),
        ]
        answer = f"It is {_degrees(rw)} °C in {city}, and the local time is {rt['time']}."
        out.append((messages, _offer(rng, ["get_weather", "get_time"], STYLES[i % 4], 0), answer))
    return out


def _degrees(result: dict[str, Any] | str) -> int:
    if isinstance(result, dict):
        return int(result["temperature_c"])
    return int(result.split(", ")[1].split(" ")[0])


TRIAGES = [
    "You are a triage agent. Hand off to the right agent.",
    "Route the user to the right specialist agent.",
    "You are a front-desk agent. Transfer the user to the agent that can help.",
]
AGENT_SYSTEMS = {
    "Weather agent": ["You are the weather agent. Use your tool.", "You answer weather questions.", None],
    "Math agent": ["You are the math agent. Use your tools.", "You do arithmetic.", None],
    "Time agent": ["You are the time agent. Use your tool.", "You tell the time.", None],
}


def _handoffs(rng: random.Random) -> list[Example]:
    """openai-agents' handoff: the triage agent calls ``transfer_to_<agent>``; the agent handed to
    sees that call and its ``{"assistant": name}`` result, then does its own job."""
    out: list[Example] = []
    for i in range(16):
        kind = ["Weather agent", "Weather agent", "Math agent", "Time agent"][i % 4]
        style = "agents" if i % 3 else "plain"
        agents = ["Weather agent", "Math agent", "Time agent"]
        offered = [handoff(a, style) for a in rng.sample(agents, 3 if i % 2 else 2) if a == kind or rng.random() < 0.8]
        if not any(t["function"]["name"] == handoff(kind)["function"]["name"] for t in offered):
            offered.append(handoff(kind, style))
        rng.shuffle(offered)
        city = CITIES[(i * 17 + 5) % len(CITIES)]
        if kind == "Weather agent":
            ask, name, args = WEATHER_ASKS[(i * 5 + 3) % len(WEATHER_ASKS)].format(city), "get_weather", {"city": city}
            result, answer = _weather(i + 3, city)
        elif kind == "Time agent":
            ask, name, args = TIME_ASKS[(i * 3) % len(TIME_ASKS)].format(city), "get_time", {"city": city}
            result, answer = _time(i + 5, city)
        else:
            a, b = 6 + (i * 7) % 19, 3 + (i * 5) % 9
            ask, name = MATH_ASKS[i % len(MATH_ASKS)]
            ask, args = ask.format(a, b), {"a": a, "b": b}
            value = a * b if name == "multiply" else a + b
            result, answer = str(value), f"{a} {'times' if name == 'multiply' else 'plus'} {b} is {value}."
        transfer = "transfer_to_" + kind.lower().replace(" ", "_")
        triage = TRIAGES[i % len(TRIAGES)]
        head = [_user(ask), _call(f"call_h{i}", transfer, {})]
        out.append(([{"role": "system", "content": triage}, head[0]], offered, _call_text(head[1])))
        own = [tool(name, style)] + (
            [tool("add" if name == "multiply" else "multiply", style)] if kind == "Math agent" else []
        )
        system = AGENT_SYSTEMS[kind][i % 3]
        messages = _start(rng, system) + [
            *head,
            _result(f"call_h{i}", {"assistant": kind}),
            _call(f"call_x{i}", name, args),
            _result(f"call_x{i}", result),
        ]
        out.append((messages, own, answer))
    # Nothing to hand off: the triage agent answers itself.
    for i, (question, answer) in enumerate(TEXT_ANSWERS[3:6]):
        offered = [handoff("Weather agent", "agents"), handoff("Math agent", "agents")]
        out.append(([{"role": "system", "content": TRIAGES[i % 3]}, _user(question)], offered, answer))
    return out


RESULT_MODELS: list[dict[str, str]] = [
    {"city": "string", "temperature_c": "integer"},
    {"city": "string", "conditions": "string"},
    {"temperature_c": "integer", "conditions": "string"},
    {"city": "string", "temperature_c": "integer", "conditions": "string"},
    {"summary": "string"},
]


def _structured(rng: random.Random) -> list[Example]:
    """pydantic-ai's structured result: its system prompt, the real tool and the ``final_result``
    output tool offered (tool_choice required); the real tool first, then after its result
    ``final_result`` with the answer's fields (it ends the run; no answer text)."""
    out: list[Example] = []
    systems = ["Report the weather.", None, "You are a weather reporter.", "Be concise."]
    for i in range(12):
        city = CITIES[(i * 19 + 8) % len(CITIES)]
        result, answer = _weather(i + 6, city)
        if not isinstance(result, dict):
            result, answer = _weather(i + 7, city)
        assert isinstance(result, dict)
        ask = WEATHER_ASKS[(i * 7 + 1) % len(WEATHER_ASKS)].format(city)
        fields = RESULT_MODELS[i % len(RESULT_MODELS)]
        final = {f: (answer if f == "summary" else result[f]) for f in fields}
        style = "pydantic" if i % 4 else "plain"
        tools = [tool("get_weather", style)] + ([tool("get_time", style)] if i % 5 == 2 else [])
        tools.append(final_result(fields, style))
        system = systems[i % len(systems)] or (DEFAULT_SYSTEM if i % 2 else "")
        messages = (_start(rng, system) if system else []) + [
            _user(ask),
            _call(f"call_s{i}", "get_weather", {"city": city}),
            _result(f"call_s{i}", result, compact=style == "pydantic"),
        ]
        out.append((messages, tools, _call_text(_call("f", "final_result", final))))
    for i in range(2):  # a math tool, then the number as the result
        a, b = 5 + i * 4, 9 + i
        tools = [tool("multiply", "pydantic"), final_result({"result": "number"})]
        messages = [
            {"role": "system", "content": "Compute the answer."},
            _user(f"What is {a} times {b}?"),
            _call(f"call_r{i}", "multiply", {"a": a, "b": b}),
            _result(f"call_r{i}", str(a * b)),
        ]
        out.append((messages, tools, _call_text(_call("f", "final_result", {"result": a * b}))))
    return out


def _answer_schema(fields: dict[str, str], i: int) -> dict[str, Any]:
    """A ``response_format`` JSON schema: openai-agents' output_type shape (titles, strict) or a
    hand-written one."""
    if i % 2:
        props = {f: {"title": f.replace("_", " ").title(), "type": t} for f, t in fields.items()}
        return {
            "properties": props,
            "required": list(fields),
            "title": "Report",
            "type": "object",
            "additionalProperties": False,
        }
    return {"type": "object", "properties": {f: {"type": t} for f, t in fields.items()}, "required": list(fields)}


def _with_schema(rng: random.Random) -> list[Example]:
    """Tools beside a ``response_format`` JSON schema (shown to the model by the template): the
    call first, then after its result the answer as that JSON (compact, as the grammar writes it)."""
    out: list[Example] = []
    for i in range(10):
        city = CITIES[(i * 23 + 11) % len(CITIES)]
        result, answer = _weather(i + 1, city)
        if not isinstance(result, dict):
            result, answer = _weather(i + 2, city)
        assert isinstance(result, dict)
        fields = RESULT_MODELS[i % len(RESULT_MODELS)]
        final = {f: (answer if f == "summary" else result[f]) for f in fields}
        style = STYLES[i % 4]
        messages = _start(rng) + [
            _user(WEATHER_ASKS[(i * 5 + 2) % len(WEATHER_ASKS)].format(city)),
            _call(f"call_j{i}", "get_weather", {"city": city}),
            _result(f"call_j{i}", result, compact=style == "pydantic"),
        ]
        text = json.dumps(final, ensure_ascii=False, separators=(",", ":"))
        out.append((messages, _offer(rng, ["get_weather"], style), text, _answer_schema(fields, i)))
    return out


def _call_text(message: dict[str, Any]) -> str:
    call = message["tool_calls"][0]["function"]
    return tool_call_text(call["name"], call["arguments"])
