"""openai-agents: a triage agent hands off to a weather agent (``transfer_to_weather_agent``),
which calls its tool and answers."""

from __future__ import annotations

import json

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from common import API_KEY, BASE_URL, TOOLS_MODEL, weather_of
from openai import AsyncOpenAI

set_tracing_disabled(True)
GREEDY = ModelSettings(temperature=0)  # the demo's answers are reproducible
model = OpenAIChatCompletionsModel(model=TOOLS_MODEL, openai_client=AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY))
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    calls.append(city)
    return json.dumps(weather_of(city))


weather_agent = Agent(
    name="Weather agent",
    instructions="You are the weather agent. Use your tool.",
    tools=[get_weather],
    model=model,
    model_settings=GREEDY,
)
triage = Agent(
    name="Triage agent",
    instructions="You are a triage agent. Hand off to the right agent.",
    handoffs=[weather_agent],
    model=model,
    model_settings=GREEDY,
)
result = Runner.run_sync(triage, "What's the weather in Oslo?")
print("answered by:", result.last_agent.name)
print("tool calls:", calls)
print("final:", result.final_output)
