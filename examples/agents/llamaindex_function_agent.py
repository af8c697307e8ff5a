"""LlamaIndex: a FunctionAgent with two tools through OpenAILike (default max_iterations)."""

from __future__ import annotations

import asyncio

from common import API_KEY, BASE_URL, TOOLS_MODEL
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai_like import OpenAILike

calls: list[tuple[float, float]] = []


def multiply(a: float, b: float) -> float:
    """Multiply two numbers"""
    calls.append((a, b))
    return a * b


def add(a: float, b: float) -> float:
    """Add two numbers"""
    return a + b


llm = OpenAILike(
    model=TOOLS_MODEL,
    api_base=BASE_URL,
    api_key=API_KEY,
    is_chat_model=True,
    is_function_calling_model=True,
    context_window=8192,
    temperature=0,
)
agent = FunctionAgent(tools=[multiply, add], llm=llm, system_prompt="You are a helpful assistant.")


async def main() -> None:
    response = await agent.run("What is 7 times 8?")
    print("tool calls:", calls)
    print("final:", response)


asyncio.run(main())
