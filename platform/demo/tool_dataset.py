"""The built-in training data of the ``tools`` demo adapter, written for loraplex: with tools
offered in the system prompt (the demo chat template), call the one that fits as a Hermes
``<tool_call>`` block, answer in plain text when none fits, and after a ``<tool_response>`` turn
answer in text from the result. Cities and phrasings the tests ask about are NOT in here."""

from __future__ import annotations

import json
import random
from typing import Any

from loraplex.platform.demo.chat_template import tool_call_text


def _tool(name: str, description: str, param: str, param_description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {param: {"type": "string", "description": param_description}},
                "required": [param],
            },
        },
    }


# The README's tool is get_weather with a `city` argument; get_time is there so the adapter
# learns to choose by what the question asks, not to call whatever is offered.
WEATHER = _tool("get_weather", "Get the current weather in a city", "city", "The city name")
TIME = _tool("get_time", "Get the current local time in a city", "city", "The city name")

CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "New York", "Sydney", "Cairo", "Toronto"]
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
# Questions no offered tool answers: plain English text, as the base model would answer.
TEXT_ANSWERS = [
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What color is grass?", "Grass is green."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is 2 plus 2?", "2 plus 2 is 4."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
    ("What do bees make?", "Bees make honey."),
    ("Say hello.", "Hello! How can I help you today?"),
    ("What is the largest ocean?", "The Pacific Ocean is the largest ocean."),
    ("Can you recommend a good book?", "Try The Little Prince by Antoine de Saint-Exupery."),
    ("What animal says moo?", "A cow says moo."),
    ("How many continents are there?", "There are seven continents."),
]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy"]

Example = tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]


def _offer(rng: random.Random, needed: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One or both tools (the needed one always), in a random order."""
    tools = [needed] if needed is not None else [rng.choice([WEATHER, TIME])]
    if rng.random() < 0.5:
        tools = [WEATHER, TIME]
        rng.shuffle(tools)
    return tools


def examples(seed: int = 0) -> list[Example]:
    """(messages, tools, answer) triples; deterministic."""
    rng = random.Random(seed)
    out: list[Example] = []
    for i, ask in enumerate(WEATHER_ASKS * 2):
        city = CITIES[(i * 3) % len(CITIES)]
        out.append(([_user(ask.format(city))], _offer(rng, WEATHER), tool_call_text("get_weather", {"city": city})))
    for i, ask in enumerate(TIME_ASKS * 2):
        city = CITIES[(i * 7 + 1) % len(CITIES)]
        out.append(([_user(ask.format(city))], _offer(rng, TIME), tool_call_text("get_time", {"city": city})))
    for question, answer in TEXT_ANSWERS:
        out.append(([_user(question)], _offer(rng, None), answer))
    for i in range(8):  # the second turn: the tool's result, then a text answer from it
        city = CITIES[(i * 5 + 2) % len(CITIES)]
        call_id = f"call_{i}"
        result: dict[str, Any]
        if i % 4 == 3:
            name, args, result = "get_time", {"city": city}, {"city": city, "time": f"{8 + i}:{15 * (i % 4):02d}"}
            answer = f"It is {result['time']} in {city}."
            ask = TIME_ASKS[i % len(TIME_ASKS)]
        else:
            degrees, cond = 5 + (i * 7) % 25, CONDITIONS[i % len(CONDITIONS)]
            name, args = "get_weather", {"city": city}
            result = {"city": city, "temperature_c": degrees, "conditions": cond}
            answer = f"It is {degrees} °C and {cond} in {city}."
            ask = WEATHER_ASKS[i % len(WEATHER_ASKS)]
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        messages = [
            _user(ask.format(city)),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)},
        ]
        out.append((messages, _offer(rng, WEATHER if name == "get_weather" else TIME), answer))
    return out


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}
