"""pydantic-ai: a tool, then a structured result (its ``final_result`` output tool) validated
into a pydantic model."""

from __future__ import annotations

from common import API_KEY, BASE_URL, TOOLS_MODEL, weather_of
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


class Report(BaseModel):
    city: str
    temperature_c: int


model = OpenAIChatModel(TOOLS_MODEL, provider=OpenAIProvider(base_url=BASE_URL, api_key=API_KEY))
agent = Agent(model, output_type=Report, system_prompt="Report the weather.", model_settings={"temperature": 0})
calls: list[str] = []


@agent.tool_plain
def get_weather(city: str) -> dict:
    """Get the current weather in a city."""
    calls.append(city)
    return weather_of(city)


result = agent.run_sync("Weather report for Paris, please.")
print("tool calls:", calls)
print("output:", repr(result.output))
