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
@pytest.mark.xfail(
    reason="measured with the demo adapter (benchmarks/demo/tools_adapter.py): after the handoff's result the "
    "weather agent answers in text instead of calling get_weather (handoff_next 0/3 held-out; on 2026-12-06 the "
    "example printed 'tool calls: []' and 'final: It is 2023 and 2022.' after a correct handoff), and the triage "
    "call's arguments are not {} unless the grammar constrains them (it does here). A 135-conversation mix in the "
    "frameworks' own tool shapes (branch agents3, b373995/729afa2) did not fix it either (0/3)",
    strict=False,
)
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
@pytest.mark.xfail(
    reason="measured with the committed tools adapter: pydantic-ai asks tool_choice=required for its final_result "
    "output tool, and the adapter calls get_weather again instead of final_result until pydantic-ai's 50-request "
    "limit (UsageLimitExceeded); the adapter trained on the earlier 79-conversation mix (commit 9131c44) called "
    "final_result and the example printed Report(city='Paris', temperature_c=18); NativeOutput instead "
    "loops the same way (the adapter never learned a JSON answer after a tool result). Not run: the loop to "
    "pydantic-ai's limit cost 134 s of every suite run; run it by hand with --runxfail (still failing on "
    "2026-12-06, AMD EPYC 2-core)",
    strict=False,
    run=False,
)
def test_pydantic_ai_tool_and_structured_result(server, demo_key_with_adapters):
    out = run_example(server, demo_key_with_adapters, "pydantic_ai_structured.py")
    assert "tool calls: ['Paris']" in out and "Report(city='Paris', temperature_c=18)" in out, out


@pytest.mark.timeout(900)
@pytest.mark.xfail(
    reason="depends on the machine: on the AMX Xeon of 2026-12-06 the cached adapter (key c4d1c2da9fb746d7, 8/24 "
    "first calls right on held-out phrasings) answered 'What is 7 times 8?' in text ('7 times 8 is 54.') without "
    "calling multiply in 5 of 5 runs, the same code and cache having passed it two hours earlier; CI's own adapter "
    "passed it, and the same weights passed it 3 of 3 runs on a 2-core AMD EPYC (Zen 3, AVX2) later that day: "
    "the call for this question is near a tie that the CPU's arithmetic decides",
    strict=False,
)
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
