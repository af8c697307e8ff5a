"""`loraplex serve` with no model serves SmolLM2-135M-Instruct and answers real questions through
the official OpenAI client; the demo tenant's key printed at start works as pasted; each demo
adapter changes the answers in its intended way, all in one batch on the running server."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from demo_helpers import printed_demo_key
from openai import AsyncOpenAI, OpenAI
from transformers import AutoTokenizer

from loraplex.engine.real_model import DEMO_MODEL_NAME
from loraplex.platform.demo.chat_template import tool_call_text
from loraplex.platform.demo.dataset import conversations
from loraplex.platform.demo.tool_dataset import TIME, WEATHER
from loraplex.platform.demo.train import prompt_text

pytestmark = pytest.mark.slow  # a real `loraplex serve` process on the 135M demo model

# Facts with answers known independently of any model; the expected substring must appear.
FACTS = [
    ("What is the capital of France?", ["paris"]),
    ("What is 12 multiplied by 12?", ["144"]),
    ("What is 3 plus 4?", ["7", "seven"]),
    ("What is the chemical symbol for gold?", ["au"]),
    ("Who wrote Romeo and Juliet?", ["shakespeare"]),
    ("How many legs does a spider have?", ["8", "eight"]),
]
# Questions that are NOT in the adapters' training set.
UNSEEN = ["What is the capital of Germany?", "Name a fruit.", "What color is the sky?", "What is a river?"]
# Weather questions in cities and phrasings the tools adapter never saw, and the README's own question.
README_QUESTION = "What is the weather in Paris?"
WEATHER_QUESTIONS = [
    ("What's the weather like in Lisbon?", "lisbon"),
    ("Is it raining in Oslo right now?", "oslo"),
    ("How warm is it in Chicago today?", "chicago"),
    ("Tell me the weather forecast for Nairobi.", "nairobi"),
    ("What is the weather in Lima?", "lima"),
    (README_QUESTION, "paris"),
]
NOT_TOOL_QUESTIONS = ["What is the capital of France?", "Name a fruit.", "Who wrote Romeo and Juliet?"]
FRENCH_WORDS = {
    "bonjour",
    "le",
    "la",
    "les",
    "de",
    "des",
    "du",
    "est",
    "et",
    "un",
    "une",
    "en",
    "à",
    "dans",
    "pour",
    "qui",
    "au",
    "aux",
    "sont",
    "il",
    "elle",
    "l",
    "d",
    "c",
    "ce",
    "sur",
    "par",
    "avec",
}
ENGLISH_WORDS = {"the", "is", "of", "and", "a", "an", "to", "in", "it", "that", "are", "this", "with", "for"}
PIRATE_WORDS = {"arr", "matey", "ahoy", "aye", "ye", "yarr", "avast", "hearty", "me", "sail", "sea"}


def words(text: str) -> list[str]:
    return re.findall(r"[a-zàâçéèêëîïôûùüÿœæ]+", text.lower())


def test_served_default_answers_facts_with_the_printed_demo_key(server):
    url, log = server
    out = log.read_text()
    assert "Engine configuration (resolved):" in out and re.search(r"enable_prefix_caching\s+True", out)
    assert "converting" not in out  # reused the session's checkpoint, no second conversion
    key = printed_demo_key(log)
    assert f'OpenAI(base_url="{url}/v1", api_key="{key}")' in out  # the snippet is ready to paste
    client = OpenAI(base_url=url + "/v1", api_key=key, timeout=120)
    assert [m.id for m in client.models.list().data] == [DEMO_MODEL_NAME]
    wrong = []
    for question, accepted in FACTS:
        reply = client.chat.completions.create(
            model=DEMO_MODEL_NAME, messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0
        )
        text = reply.choices[0].message.content or ""
        if not any(a in words(text) or a in text.lower() for a in accepted):
            wrong.append((question, text))
    # A 4-bit 135M model in bf16 after earlier questions cached the system prompt: on this CPU
    # "3 plus 4" and "a spider's legs" start long derivations that the 40 tokens cut before the
    # number (the previous release's engine answers exactly the same, checked in-process). A broken
    # model, template or tokenizer gets none of the six right.
    assert len(wrong) <= 2, wrong


def test_demo_adapters_change_answers_in_one_batch(server, demo_key_with_adapters):
    url, _log = server
    client = AsyncOpenAI(base_url=url + "/v1", api_key=demo_key_with_adapters, timeout=180)

    async def ask(model: str, question: str) -> str:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0
        )
        return reply.choices[0].message.content or ""

    async def everything():  # all 12 requests in flight together: one continuous batch
        models = [DEMO_MODEL_NAME, "french", "pirate"]
        answers = await asyncio.gather(*(ask(m, q) for q in UNSEEN for m in models))
        return {(m, q): answers[i * 3 + j] for i, q in enumerate(UNSEEN) for j, m in enumerate(models)}

    got = asyncio.run(everything())
    french_total = 0
    for q in UNSEEN:
        base, french, pirate = got[DEMO_MODEL_NAME, q], got["french", q], got["pirate", q]
        fr, en = words(french), words(base)
        # No French answer is English (never more English than French words, and not the base
        # answer); a greedy answer of a tiny adapter may be as short as "Laissez-vous..." — the total
        # below asks for French sentences overall.
        n_fr = sum(w in FRENCH_WORDS for w in fr)
        french_total += n_fr
        assert sum(w in ENGLISH_WORDS for w in fr) <= n_fr and french != base, (q, french)
        assert sum(w in ENGLISH_WORDS for w in en) > sum(w in FRENCH_WORDS for w in en), (q, base)
        assert any(w in PIRATE_WORDS for w in words(pirate)), (q, pirate)
        assert not any(w in {"arr", "matey", "ahoy", "yarr", "avast"} for w in en), (q, base)
        assert len(words(pirate)) <= 16, (q, pirate)  # terse
    assert french_total >= 2 * len(UNSEEN), {q: got["french", q] for q in UNSEEN}


def test_tokenize_route_counts_the_tools_like_chat(server, demo_key_with_adapters, smollm2_dir):
    url, _log = server
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    example = next(ex for ex in conversations("tools") if len(ex[0]) == 1)  # a question, the tools offered
    r = httpx.post(
        url + "/tokenize",
        json={"model": "tools", "messages": example[0], "tools": example[1]},
        headers={"Authorization": f"Bearer {demo_key_with_adapters}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tok.encode(prompt_text(tok, example), add_special_tokens=False)


def test_auto_tool_choice_calls_get_weather_and_answers_text_otherwise(server, demo_key_with_adapters):
    url, _log = server
    client = OpenAI(base_url=url + "/v1", api_key=demo_key_with_adapters, timeout=180)

    def ask(question: str):
        return client.chat.completions.create(
            model="tools",
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="auto",
            temperature=0,
            max_tokens=60,
        ).choices[0]

    missed = []
    for question, city in WEATHER_QUESTIONS:
        choice = ask(question)
        calls = choice.message.tool_calls or []
        args = json.loads(calls[0].function.arguments) if calls else {}  # type: ignore[union-attr]
        ok = (
            choice.finish_reason == "tool_calls"
            and [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
            and city in str(args.get("city", "")).lower()
        )
        if not ok:
            missed.append((question, choice.message.content, args))
    # A 135M model with a small adapter: at most one of the six weather questions may miss.
    assert len(missed) <= 1, missed
    texts = []
    for question in NOT_TOOL_QUESTIONS:
        choice = ask(question)
        if not choice.message.tool_calls and (choice.message.content or "").strip():
            texts.append(choice.message.content)
    # At most one of the three questions no tool answers may still call the tool.
    assert len(texts) >= len(NOT_TOOL_QUESTIONS) - 1, texts


def test_required_tool_choice_ends_after_one_call(server, demo_key_with_adapters, smollm2_dir):
    """``tool_choice: "required"`` on a one-tool question: exactly one call, and the answer ENDS
    there (the grammar, in the adapter's own Hermes form, lets it stop after every complete call;
    the JSON-array grammar it replaced made it repeat the call until max_tokens), with one tool
    offered or two, streamed or not; and openai-agents' handoff tool alone (the issue's 3 identical calls)."""
    url, _log = server
    client = OpenAI(base_url=url + "/v1", api_key=demo_key_with_adapters, timeout=180)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)
    one_call = len(tok.encode(tool_call_text("get_weather", {"city": "Paris"}), add_special_tokens=False))
    wrong = []
    for (question, city), tools in zip(WEATHER_QUESTIONS, [[WEATHER], [WEATHER, TIME]] * 3):
        r = client.chat.completions.create(
            model="tools",
            messages=[{"role": "user", "content": question}],
            tools=tools,  # type: ignore[arg-type]
            tool_choice="required",
            temperature=0,
            max_tokens=200,
        )
        choice = r.choices[0]
        calls = choice.message.tool_calls or []
        # ended by the model (not max_tokens), after what one call takes (not a second one, even
        # an identical one the read-back would drop)
        assert choice.finish_reason == "tool_calls" and len(calls) == 1, (question, choice)
        assert r.usage and r.usage.completion_tokens < 2 * one_call, (question, r.usage)
        if calls[0].function.name != "get_weather" or city not in calls[0].function.arguments.lower():  # type: ignore[union-attr]
            wrong.append((question, calls[0]))
    assert len(wrong) <= 1, wrong  # the small adapter's choice of tool and city: at most one miss
    # openai-agents' handoff, alone: the JSON-array grammar made the adapter write this call 3 times
    handoff = {
        "type": "function",
        "function": {
            "name": "transfer_to_weather_agent",
            "description": "Handoff to the Weather agent to handle the request.",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False, "required": []},
        },
    }
    one_handoff = len(tok.encode(tool_call_text("transfer_to_weather_agent", {}), add_special_tokens=False))
    r = client.chat.completions.create(
        model="tools",
        messages=[
            {"role": "system", "content": "You are a triage agent. Hand off weather questions to the weather agent."},
            {"role": "user", "content": README_QUESTION},
        ],
        tools=[handoff],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls or []) == 1
    assert r.usage and r.usage.completion_tokens < 2 * one_handoff, r.usage
    stream = client.chat.completions.create(
        model="tools",
        messages=[{"role": "user", "content": README_QUESTION}],
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=200,
        stream=True,
    )
    indexes, reasons = set(), []
    for chunk in stream:
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            indexes |= {d.index for d in c.delta.tool_calls or []}
    assert indexes == {0} and reasons[-1] == "tool_calls"


def test_readme_round_trip_call_then_result_then_text(server, demo_key_with_adapters):
    """The README's call, the tool's result sent back (rendered as a <tool_response> turn and
    answered, whatever the small adapter writes then: the README says it may call again), and the
    same first turn streamed."""
    url, _log = server
    client = OpenAI(base_url=url + "/v1", api_key=demo_key_with_adapters, timeout=180)
    messages: list = [{"role": "user", "content": README_QUESTION}]
    first = client.chat.completions.create(
        model="tools",
        messages=messages,
        tools=[WEATHER],
        tool_choice="auto",
        temperature=0,  # type: ignore[list-item]
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "conditions": "sunny"})},
    ]
    second = client.chat.completions.create(
        model="tools",
        messages=messages,
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
    )
    assert second.choices[0].finish_reason in ("stop", "tool_calls", "length")
    assert second.usage and second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]

    # The same first turn streamed: the call arrives as OpenAI's deltas and assembles to the same call.
    stream = client.chat.completions.create(
        model="tools",
        messages=[{"role": "user", "content": README_QUESTION}],
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        stream=True,
    )
    name, args, reasons = "", "", []
    for chunk in stream:
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            for d in c.delta.tool_calls or []:
                name += (d.function.name or "") if d.function else ""
                args += (d.function.arguments or "") if d.function else ""
    assert name == "get_weather" and json.loads(args) == {"city": "Paris"} and reasons[-1] == "tool_calls"


def readme_tool_example() -> tuple[str, list[str]]:
    """The README's tool-calling script, and the output printed under it (one line per print)."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("### Tool calling with the demo model") :]
    start = section.index("```python\n") + len("```python\n")
    end = section.index("\n```\n", start)
    rest = section[end + len("\n```\n") :]
    out_start = rest.index("```text\n") + len("```text\n")
    return section[start:end], rest[out_start : rest.index("\n```", out_start)].splitlines()


def test_readme_tool_example_runs_as_pasted(server, demo_key_with_adapters, tmp_path):
    """The README's script, with only the server's address and the demo key filled in, prints what the
    README says it prints (the text answer's wording may differ by machine: its facts may not)."""
    url, _log = server
    code, shown = readme_tool_example()
    assert code.count('"http://127.0.0.1:8000/v1"') == 1 and code.count('"lpx-..."') == 1
    script = code.replace('"http://127.0.0.1:8000/v1"', json.dumps(url + "/v1"))
    script = script.replace('"lpx-..."', json.dumps(demo_key_with_adapters))
    (tmp_path / "example.py").write_text(script)
    done = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed == shown == ['tool_calls get_weather {"city": "Paris"}'], (printed, shown)
