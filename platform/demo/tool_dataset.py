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
  tool's result, and the same conversation without the output tool answered in text (a minimal
  pair: the offered tools decide, not the result);
- more of the turns after a result that are calls (``loop_endings``), in cities of their own.

Fifty cities (and more for ``loop_endings``), results with and without the city, arithmetic with
numbers of all sizes: a small adapter learns to copy what the question and the result say only
when the names and numbers vary. What each part changed is measured in
benchmarks/demo/tools_adapter.py's docstring.

Every assistant turn of a conversation is a training target (platform/demo/encode.py). Cities,
numbers and phrasings the tests and benchmarks/demo/tools_adapter.py ask about are NOT in here.
"""

from __future__ import annotations

import json
import random
from typing import Any

from loraplex.platform.demo.chat_template import DEFAULT_SYSTEM, tool_call_text


def _tool(name: str, description: str, params: dict[str, tuple[str, str]]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t, "description": d} for p, (t, d) in params.items()},
                "required": list(params),
            },
        },
    }


def handoff(agent: str) -> dict[str, Any]:
    """A handoff tool as openai-agents offers it (no arguments)."""
    name = "transfer_to_" + agent.lower().replace(" ", "_")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Handoff to the {agent} agent to handle the request. ",
            "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        },
    }


# The README's tool is get_weather with a `city` argument; the others are there so the adapter
# learns to choose by what the question asks, not to call whatever is offered.
WEATHER = _tool("get_weather", "Get the current weather in a city", {"city": ("string", "The city name")})
TIME = _tool("get_time", "Get the current local time in a city", {"city": ("string", "The city name")})
MULTIPLY = _tool("multiply", "Multiply two numbers", {"a": ("number", "first"), "b": ("number", "second")})
ADD = _tool("add", "Add two numbers", {"a": ("number", "first"), "b": ("number", "second")})
WEATHER_AGENT, MATH_AGENT = handoff("Weather agent"), handoff("Math agent")
FINAL_RESULT = {
    "type": "function",
    "function": {
        "name": "final_result",
        "description": "The final response which ends this conversation",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
            "required": ["city", "temperature_c"],
        },
    },
}
DISTRACTORS = [WEATHER, TIME, MULTIPLY, ADD]

# Fifty cities, not ten: with few, the adapter memorises their spellings and misspells a city it
# never saw (" Lima" in a question is one token, "L" + "ima" inside the call's JSON: the call has to
# spell what the question says). The first ten are the README's and the examples' (Paris).
CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "New York", "Sydney", "Cairo", "Toronto"]
CITIES += ["Beijing", "Atlanta", "Manchester", "Shanghai", "Karachi", "Kampala", "Denver", "Singapore", "Stockholm"]
CITIES += ["Brussels", "Dakar", "Geneva", "Caracas", "Munich", "Boston", "Zagreb", "Doha", "Cape Town", "Delhi"]
CITIES += ["Kyiv", "Sofia", "Calgary", "Osaka", "Tehran", "Addis Ababa", "Houston", "Chennai", "Wellington", "Tunis"]
CITIES += ["Naples", "Ankara", "Quito", "Kuala Lumpur", "Accra", "Tallinn", "Jakarta", "Bucharest", "Dubai"]
CITIES += ["Barcelona", "Colombo"]
WEATHER_ASKS = [
    "What's the weather in {}?",
    "What is the weather like in {} today?",
    "Is it raining in {}?",
    "How hot is it in {} right now?",
    "Do I need an umbrella in {} today?",
    "Tell me the weather in {}.",
    "How cold is it in {}?",
    "Is it sunny in {}?",
    "What's the temperature in {} right now?",
    "Weather in {}, please.",
]
TIME_ASKS = ["What time is it in {}?", "What's the local time in {}?", "Tell me the current time in {}."]
MATH_ASKS = [("What is {} times {}?", "multiply"), ("Multiply {} by {}.", "multiply"), ("What is {} plus {}?", "add")]
MORE_MATH_ASKS = [
    *MATH_ASKS,
    ("Calculate {} times {}.", "multiply"),
    ("Add {} and {}.", "add"),
    ("What's {} multiplied by {}?", "multiply"),
    ("What is the sum of {} and {}?", "add"),
    ("How much is {} times {}?", "multiply"),
]
# Questions no offered tool answers: plain English text, as the base model would answer.
TEXT_ANSWERS = [
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What color is grass?", "Grass is green."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
    ("What do bees make?", "Bees make honey."),
    ("Say hello.", "Hello! How can I help you today?"),
    ("What is the largest ocean?", "The Pacific Ocean is the largest ocean."),
    ("Can you recommend a good book?", "Try The Little Prince by Antoine de Saint-Exupery."),
    ("What animal says moo?", "A cow says moo."),
    ("How many continents are there?", "There are seven continents."),
    ("Thanks!", "You're welcome!"),
]
# What agents put in the system prompt (the framework's instructions); None: the template's default.
SYSTEMS = [None, None, "You are a helpful assistant.", "Answer briefly.", "You are a helpful agent. Use the tools."]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy"]

Messages = list[dict[str, Any]]
# (messages, tools, answer) or, for a request with a ``response_format`` JSON schema beside the
# tools, (messages, tools, answer, schema): the template shows the schema (encode.prompt_text)
Example = tuple[Messages, Messages | None, str] | tuple[Messages, Messages | None, str, dict[str, Any]]


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _result(call_id: str, content: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _offer(rng: random.Random, needed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The needed tools plus up to two others, in a random order."""
    others = [t for t in DISTRACTORS if t not in needed]
    tools = needed + rng.sample(others, rng.randint(0 if needed else 1, 2))
    rng.shuffle(tools)
    return tools


def _start(rng: random.Random, system: str | None = None) -> list[dict[str, Any]]:
    system = system if system is not None else rng.choice(SYSTEMS)
    return [] if system is None else [{"role": "system", "content": system}]


def _weather(rng: random.Random, i: int, city: str) -> tuple[dict[str, Any] | str, str]:
    """A weather result (JSON or a framework's plain string) and the answer written from it."""
    degrees, cond = 3 + (i * 7) % 27, CONDITIONS[i % len(CONDITIONS)]
    if i % 3 == 2:
        return f"{cond.capitalize()}, {degrees} °C", f"It is {cond} and {degrees} °C in {city}."
    answer = f"It is {degrees} °C and {cond} in {city}."
    if i % 6 == 1:  # a result without the city (tools return what they like): still the answer, not a new call
        return {"temperature_c": degrees, "conditions": cond}, answer
    return {"city": city, "temperature_c": degrees, "conditions": cond}, answer


def _time(i: int, city: str) -> tuple[dict[str, Any], str]:
    clock = f"{(7 + 5 * i) % 24:02d}:{(13 * i) % 60:02d}"
    # Every other result without the city: an adapter that saw the city in every result called
    # get_time again after {"time": "01:45"} (held-out, benchmarks/demo/tools_adapter.py).
    return ({"time": clock} if i % 2 else {"city": city, "time": clock}), f"It is {clock} in {city}."


def examples(seed: int = 0) -> list[Example]:
    """(messages, tools, answer) conversations; deterministic."""
    rng = random.Random(seed)
    out: list[Example] = []
    # One call, its result, the answer (and so also the call alone: the call turn is a target too).
    for i, ask in enumerate(WEATHER_ASKS * 2):
        city = CITIES[(i * 3) % len(CITIES)]
        result, answer = _weather(rng, i, city)
        messages = _start(rng) + [_user(ask.format(city)), _call(f"call_w{i}", "get_weather", {"city": city})]
        out.append((messages + [_result(f"call_w{i}", result)], _offer(rng, [WEATHER]), answer))
    for i, ask in enumerate(TIME_ASKS * 4):  # the weather tool offered too: choose by the question
        city = CITIES[(i * 7 + 1) % len(CITIES)]
        result, answer = _time(i, city)
        messages = _start(rng) + [_user(ask.format(city)), _call(f"call_t{i}", "get_time", {"city": city})]
        out.append((messages + [_result(f"call_t{i}", result)], _offer(rng, [TIME, WEATHER]), answer))
    for i in range(9):
        ask, name = MATH_ASKS[i % len(MATH_ASKS)]
        out.append(_arithmetic(rng, f"call_m{i}", ask, name, 3 + (i * 5) % 17, 2 + (i * 3) % 11))
    # No tool fits: a plain answer.
    for question, answer in TEXT_ANSWERS * 2:
        out.append((_start(rng) + [_user(question)], _offer(rng, []), answer))
    # Two calls, each after the previous result, then one answer.
    for i in range(10):
        first, second = CITIES[(i * 3 + 1) % len(CITIES)], CITIES[(i * 3 + 5) % len(CITIES)]
        (ra, _), (rb, _) = _weather(rng, i, first), _weather(rng, i + 4, second)
        da, db = _degrees(ra), _degrees(rb)
        messages = _start(rng) + [
            _user(
                f"What's the weather in {first} and in {second}?"
                if i % 2
                else f"Compare the weather in {first} and {second}."
            ),
            _call(f"call_a{i}", "get_weather", {"city": first}),
            _result(f"call_a{i}", ra),
            _call(f"call_b{i}", "get_weather", {"city": second}),
            _result(f"call_b{i}", rb),
        ]
        out.append((messages, _offer(rng, [WEATHER]), f"It is {da} °C in {first} and {db} °C in {second}."))
    for i in range(3):
        city = CITIES[(i * 3 + 2) % len(CITIES)]
        (rw, _), (rt, _) = _weather(rng, i, city), _time(i + 3, city)
        messages = _start(rng) + [
            _user(f"What is the weather and the time in {city}?"),
            _call(f"call_c{i}", "get_weather", {"city": city}),
            _result(f"call_c{i}", rw),
            _call(f"call_d{i}", "get_time", {"city": city}),
            _result(f"call_d{i}", rt),
        ]
        answer = f"It is {_degrees(rw)} °C in {city}, and the local time is {rt['time']}."
        out.append((messages, _offer(rng, [WEATHER, TIME]), answer))
    out += _handoffs(rng)
    out += _structured(rng)
    out += loop_endings() + _more_math()
    return out + _without_output_tool(out)


def _degrees(result: dict[str, Any] | str) -> int:
    if isinstance(result, dict):
        return int(result["temperature_c"])
    return int(result.split(", ")[1].split(" ")[0])


def _handoffs(rng: random.Random) -> list[Example]:
    """openai-agents' handoff: the triage agent calls ``transfer_to_<agent>``; the agent handed to
    sees that call and its ``{"assistant": name}`` result, then does its own job."""
    out: list[Example] = []
    triage = "You are a triage agent. Hand off to the right agent."
    for i in range(10):
        city = CITIES[(i * 7 + 3) % len(CITIES)]
        ask = WEATHER_ASKS[(i * 3) % len(WEATHER_ASKS)].format(city)
        tools = [WEATHER_AGENT, MATH_AGENT] if i % 2 else [MATH_AGENT, WEATHER_AGENT]
        head = [_user(ask), _call(f"call_h{i}", WEATHER_AGENT["function"]["name"], {})]
        out.append(([{"role": "system", "content": triage}, *head[:1]], tools, _call_text(head[1])))
        result, answer = _weather(rng, i + 1, city)
        messages = [
            {"role": "system", "content": "You are the weather agent. Use your tool."},
            *head,
            _result(f"call_h{i}", {"assistant": "Weather agent"}),
            _call(f"call_x{i}", "get_weather", {"city": city}),
            _result(f"call_x{i}", result),
        ]
        out.append((messages, [WEATHER], answer))
    for i in range(3):
        a, b = 4 + i * 6, 3 + i
        head = [_user(f"What is {a} times {b}?"), _call(f"call_g{i}", MATH_AGENT["function"]["name"], {})]
        out.append(([{"role": "system", "content": triage}, head[0]], [WEATHER_AGENT, MATH_AGENT], _call_text(head[1])))
    # Nothing to hand off: the triage agent answers itself.
    for question, answer in TEXT_ANSWERS[:3]:
        out.append(([{"role": "system", "content": triage}, _user(question)], [WEATHER_AGENT, MATH_AGENT], answer))
    return out


def _structured(rng: random.Random) -> list[Example]:
    """pydantic-ai's structured result: after the tool's result, the ``final_result`` output tool
    is called with the answer's fields (it ends the run; no answer text)."""
    out: list[Example] = []
    for i in range(8):
        city = CITIES[(i * 3 + 4) % len(CITIES)]
        result, _ = _weather(rng, i + 2, city)
        ask = WEATHER_ASKS[(i * 7 + 1) % len(WEATHER_ASKS)].format(city)
        messages = _start(rng, DEFAULT_SYSTEM if i % 2 else "Report the weather.") + [
            _user(ask),
            _call(f"call_s{i}", "get_weather", {"city": city}),
            _result(f"call_s{i}", result),
        ]
        final = {"city": city, "temperature_c": _degrees(result)}
        out.append((messages, [WEATHER, FINAL_RESULT], _call_text(_call("f", "final_result", final))))
    return out


def _call_text(message: dict[str, Any]) -> str:
    call = message["tool_calls"][0]["function"]
    return tool_call_text(call["name"], call["arguments"])


def _more_math(seed: int = 3) -> list[Example]:
    """One call, its result, the answer, for numbers of all sizes: with nine math conversations the
    adapter answered LlamaIndex's "What is 7 times 8?" with "5 times 8 is 48." after a result of 56
    (it had not learned to copy the result's number)."""
    rng = random.Random(seed)
    out: list[Example] = []
    for i in range(16):
        ask, name = MORE_MATH_ASKS[i % len(MORE_MATH_ASKS)]
        a, b = rng.randint(2, 19), rng.randint(2, 19)
        if (a, b) in ((7, 8), (8, 7), (12, 30)):  # the benchmark's and the example's questions stay held out
            a += 1
        out.append(_arithmetic(rng, f"call_k{i}", ask, name, a, b))
    return out


def _arithmetic(rng: random.Random, call_id: str, ask: str, name: str, a: int, b: int) -> Example:
    """One arithmetic question, its call (``multiply`` or ``add``), the result, the answer."""
    value = a * b if name == "multiply" else a + b
    word = "times" if name == "multiply" else "plus"
    messages = _start(rng) + [_user(ask.format(a, b)), _call(call_id, name, {"a": a, "b": b})]
    tool = MULTIPLY if name == "multiply" else ADD
    return messages + [_result(call_id, str(value))], _offer(rng, [tool]), f"{a} {word} {b} is {value}."


# Turns that decide whether an agent's loop goes on or ends, in cities and phrasings of their own
# (none of the benchmark's, the tests' or the rest of this file's): the handed-to agent's call,
# the second city's call, ``final_result`` after the result.
LOOP_CITIES = ["Prague", "Athens", "Bangkok", "Havana", "Warsaw", "Helsinki", "Istanbul", "Montreal", "Manila"]
LOOP_CITIES += ["Milan", "Auckland", "Zurich", "Valencia", "Belgrade", "Vancouver", "Miami", "Mexico City", "Hanoi"]
LOOP_CITIES += ["Reykjavik", "Bogota", "Lagos", "Amsterdam", "Santiago", "Edinburgh", "Chicago", "Kathmandu"]
LOOP_CITIES += ["Budapest", "Perth", "Riga", "Johannesburg", "Sao Paulo", "Riyadh", "Dhaka", "Glasgow"]
LOOP_CITIES += ["Buenos Aires", "Casablanca", "Phoenix", "Hamburg", "Kolkata", "Seattle", "Taipei"]
LOOP_CITIES += ["Porto", "Copenhagen"]
LOOP_ASKS = [
    "Should I bring a coat in {}?",
    "What are the conditions in {} now?",
    "Can you get me the forecast for {}?",
    "Is it freezing in {}?",
    "How humid is it in {}?",
    "What's it like outside in {}?",
]
PAIR_ASKS = [
    "Weather for {} and {}, please.",
    "Is it warmer in {} or in {}?",
    "Check the weather in {}, then in {}.",
    "I'm going from {} to {}: what's the weather in each?",
]


def loop_endings(seed: int = 1) -> list[Example]:
    """Extra conversations for the turns after a result that are calls: after a handoff, the
    agent handed to calls its tool; after the first city's result, the second city's call; after
    the tool's result, ``final_result``. Results in several shapes (a bare temperature too)."""
    rng = random.Random(seed)
    out: list[Example] = []
    agent = "You are the weather agent. Use your tool."
    for i in range(6):
        city = LOOP_CITIES[(i * 4) % len(LOOP_CITIES)]
        ask = LOOP_ASKS[i % len(LOOP_ASKS)].format(city)
        result, answer = _weather(rng, i + 20, city)
        messages = [
            {"role": "system", "content": agent},
            _user(ask),
            _call(f"call_n{i}", WEATHER_AGENT["function"]["name"], {}),
            _result(f"call_n{i}", {"assistant": "Weather agent"}),
            _call(f"call_o{i}", "get_weather", {"city": city}),
            _result(f"call_o{i}", result),
        ]
        out.append((messages, [WEATHER], answer))
    for i in range(6):
        first, second = LOOP_CITIES[(i * 2 + 1) % len(LOOP_CITIES)], LOOP_CITIES[(i * 2 + 6) % len(LOOP_CITIES)]
        ra: dict[str, Any] | str = {"temperature_c": 5 + i * 4} if i % 2 else _weather(rng, i + 30, first)[0]
        rb: dict[str, Any] | str = {"temperature_c": 26 - i * 3} if i % 3 else _weather(rng, i + 40, second)[0]
        messages = _start(rng) + [
            _user(PAIR_ASKS[i % len(PAIR_ASKS)].format(first, second)),
            _call(f"call_p{i}", "get_weather", {"city": first}),
            _result(f"call_p{i}", ra),
            _call(f"call_q{i}", "get_weather", {"city": second}),
            _result(f"call_q{i}", rb),
        ]
        answer = f"It is {_degrees(ra)} °C in {first} and {_degrees(rb)} °C in {second}."
        out.append((messages, _offer(rng, [WEATHER]), answer))
    for i in range(6):
        city = LOOP_CITIES[(i * 5 + 2) % len(LOOP_CITIES)]
        result, _ = _weather(rng, i + 50, city)
        messages = _start(rng, DEFAULT_SYSTEM if i % 2 else "Report the weather.") + [
            _user(LOOP_ASKS[(i + 3) % len(LOOP_ASKS)].format(city)),
            _call(f"call_r{i}", "get_weather", {"city": city}),
            _result(f"call_r{i}", result),
        ]
        final = {"city": city, "temperature_c": _degrees(result)}
        out.append((messages, [WEATHER, FINAL_RESULT], _call_text(_call("f", "final_result", final))))
    return out


def _without_output_tool(conversations: list[Example]) -> list[Example]:
    """Every conversation that ends with a ``final_result`` call, again without ``final_result``
    offered: then the turn after the result is the plain-text answer. Minimal pairs: what decides
    between the two is whether the output tool is offered, not the result before it (an adapter
    trained on the output-tool turns alone called get_weather with the result's fields after
    plain weather results: the loop the adapter must end)."""
    rng = random.Random(11)
    out: list[Example] = []
    for messages, tools, answer, *_schema in conversations:
        if not (tools and FINAL_RESULT in tools and answer.startswith("<tool_call>") and len(messages) > 2):
            continue
        call = [m for m in messages if m.get("tool_calls")][-1]["tool_calls"][0]["function"]
        city, result = call["arguments"]["city"], messages[-1]["content"]
        if result.startswith("{"):
            fields = json.loads(result)
            text = f"It is {fields['temperature_c']} °C and {fields.get('conditions', 'clear')} in {city}."
        else:  # "Rainy, 17 °C"
            conditions, degrees = result.split(", ")
            text = f"It is {conditions.lower()} and {degrees} in {city}."
        out.append((messages, _offer(rng, [WEATHER]), text))
    return out
