"""openai-agents: the tool agent run streamed (``Runner.run_streamed``), events as they come."""

from __future__ import annotations

import asyncio
import json

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from common import API_KEY, BASE_URL, TOOLS_MODEL, weather_of
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent

set_tracing_disabled(True)
GREEDY = ModelSettings(temperature=0)  # the demo's answers are reproducible
model = OpenAIChatCompletionsModel(model=TOOLS_MODEL, openai_client=AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY))


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return json.dumps(weather_of(city))


async def main() -> None:
    agent = Agent(
        name="Assistant",
        instructions="You are a helpful assistant.",
        tools=[get_weather],
        model=model,
        model_settings=GREEDY,
    )
    result = Runner.run_streamed(agent, "Is it sunny in Paris?")
    text, items = "", []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent):
            text += event.data.delta
        elif event.type == "run_item_stream_event":
            items.append(event.item.type)
    print("items:", items)
    print("streamed text:", text)
    print("final:", result.final_output)


asyncio.run(main())
