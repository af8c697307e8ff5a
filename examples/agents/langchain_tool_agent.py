"""LangChain: a tool-calling agent loop with ``ChatOpenAI.bind_tools`` (call -> ToolMessage ->
answer), ending when the model answers in text."""

from __future__ import annotations

import json

from common import API_KEY, BASE_URL, TOOLS_MODEL, weather_of
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return json.dumps(weather_of(city))


llm = ChatOpenAI(model=TOOLS_MODEL, base_url=BASE_URL, api_key=API_KEY, temperature=0).bind_tools([get_weather])
messages: list = [SystemMessage("You are a helpful assistant."), HumanMessage("What's the weather in Paris?")]
turns = 0
while turns < 5:  # an agent's turn limit
    turns += 1
    reply = llm.invoke(messages)
    messages.append(reply)
    if not reply.tool_calls:
        break
    for call in reply.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
print("turns:", turns)
print("tool calls:", [m.tool_call_id for m in messages if isinstance(m, ToolMessage)])
print("final:", messages[-1].content)
