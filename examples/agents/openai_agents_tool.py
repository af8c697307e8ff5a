"""openai-agents: one agent with a function tool, run to its final output (default max_turns)."""

from __future__ import annotations

import json

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from common import API_KEY, BASE_URL, TOOLS_MODEL, weather_of
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no traces sent to OpenAI
GREEDY = ModelSettings(temperature=0)  # the demo's answers are reproducible
model = OpenAIChatCompletionsModel(model=TOOLS_MODEL, openai_client=AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY))
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    calls.append(city)
    return json.dumps(weather_of(city))


agent = Agent(
    name="Assistant",
    instructions="You are a helpful assistant.",
    tools=[get_weather],
    model=model,
    model_settings=GREEDY,
)
result = Runner.run_sync(agent, "What's the weather in Paris?")
print("tool calls:", calls)
print("final:", result.final_output)
