"""examples/agents/: each framework's first agent example, as a user runs it, against a real
`loraplex serve` of the demo model with the demo adapters (the ``tools`` adapter trained on whole
agent turns). Each must finish within the framework's DEFAULT turn limit (openai-agents'
max_turns, LlamaIndex's max_iterations, pydantic-ai's request limit) with the tool run and an
answer that uses its result: the bug this guards is an agent loop that never ends because the
model calls the tool again after the result."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def run_example(server, key: str, name: str) -> str:
    url, _log = server
    env = {
        **os.environ,
        "LORAPLEX_BASE_URL": url + "/v1",
        "LORAPLEX_API_KEY": key,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=600, env=env, cwd=EXAMPLES
    )
    print(done.stdout)  # what the example printed: shown with -rP, and with any failure
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(900)
def test_openai_agents_tool(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "openai_agents_tool.py")
    # Measured (greedy): the tool runs twice for Paris, then the answer from its result, within
    # openai-agents' default max_turns (10).
    calls = ast.literal_eval(out.split("tool calls:")[1].splitlines()[0].strip())  # the printed list
    assert calls and set(calls) == {"Paris"} and "18" in out.split("final:")[1], out


@pytest.mark.timeout(900)
def test_openai_agents_handoff(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "openai_agents_handoff.py")
    assert "answered by: Weather agent" in out and "tool calls: ['Oslo']" in out, out
    assert "4" in out.split("final:")[1], out


@pytest.mark.timeout(900)
def test_openai_agents_streamed(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "openai_agents_streamed.py")
    assert "tool_call_item" in out and "tool_call_output_item" in out and "message_output_item" in out, out
    streamed, final = out.split("streamed text:")[1].split("\nfinal:")
    assert streamed.strip() and final.strip().endswith(streamed.strip()[-10:]), out


@pytest.mark.timeout(900)
def test_pydantic_ai_tool_and_structured_result(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "pydantic_ai_structured.py")
    assert "tool calls: ['Paris']" in out and "Report(city='Paris', temperature_c=18)" in out, out


@pytest.mark.timeout(900)
def test_llamaindex_function_agent(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "llamaindex_function_agent.py")
    assert "tool calls: [(7" in out and "56" in out.split("final:")[1], out


@pytest.mark.timeout(900)
def test_langchain_tool_calling_agent(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "langchain_tool_agent.py")
    # The loop ends with a text answer from the result (measured: the demo adapter calls the tool
    # twice, then answers: 3 turns of the example's 5).
    turns = int(out.split("turns:")[1].split()[0])
    assert turns < 5 and "18" in out.split("final:")[1], out


@pytest.mark.timeout(900)
def test_dspy_typed_predict_with_json_mode(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "dspy_typed_predict.py")
    assert "capital: Paris" in out and "population_millions:" in out, out
    float(out.split("population_millions:")[1].split()[0])  # DSPy parsed a number (the JSON's, by the schema)
