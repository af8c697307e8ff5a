"""Five client libraries nobody here wrote, against a real uvicorn on the random demo model: the
`openai` SDK, langchain-openai, instructor, pydantic-ai and openai-agents (its default Responses
model). Each runs a structured output, a tool round trip, a stream and a stream with tools (a
streamed call; for instructor and pydantic-ai the structured output IS a streamed tool call), and
the Responses API where the client uses it (openai SDK, pydantic-ai's Responses model, openai-agents).

What each test proves, honestly: a random model cannot choose a tool or write meaningful JSON by
itself, so the calls are forced where the framework lets us (a named or required ``tool_choice``)
and JSON is the grammar's doing. The tests prove that each framework's requests are accepted, that
what it parses out of our answers (tool calls, JSON, stream deltas) is what it needs, and that the
tool result goes back to the server in the framework's own message format — not the model's
judgement. Oracles: the frameworks' own validation (pydantic models), jsonschema, and the
non-streamed answer of the same greedy request."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Annotated, Literal

import httpx
import openai
import pytest
from platform_helpers import admin_headers
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


class Weather(BaseModel):
    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=7)


# A random model's free text is random bytes that the detokenizer may hold back until a character is
# complete; streams are checked on grammar-constrained JSON, whose tokens are ASCII (so every token
# can be a chunk). A stream that falls behind the engine gets the queued tokens as one chunk
# (async_engine coalesces), so the tests ask for "more than one chunk", never a count per token.
ASCII = {
    "type": "json_schema",
    "json_schema": {
        "name": "n",
        "schema": {
            "type": "object",
            "properties": {"n": {"type": "array", "items": {"enum": [1, 22, 333]}, "minItems": 8, "maxItems": 8}},
            "required": ["n"],
        },
    },
}

CALLS: list[tuple[str, int]] = []


def get_weather(city: Literal["Paris", "Oslo"], days: Annotated[int, Field(ge=1, le=7)]) -> str:
    """Weather forecast for a city. (Bounded days: an unbounded integer lets a random model write
    digits until max_tokens cuts the arguments.)"""
    CALLS.append((city, days))
    return f"sunny in {city} for {days} days"


@pytest.fixture
def live(live_factory):
    srv = live_factory()
    with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as c:
        tid = c.post("/admin/v1/tenants", json={"name": "fw"}).json()["id"]
        key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    CALLS.clear()
    return srv.url + "/v1", key, srv.ctx.engine.model_name


# ---------------------------------------------------------------------------------------- openai SDK
def test_openai_sdk(live):
    base_url, key, model = live
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    parsed = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Weather?"}], response_format=Weather, max_tokens=60
    )
    assert isinstance(parsed.choices[0].message.parsed, Weather)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    msgs: list = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model=model, messages=msgs, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=200
    )  # the call in the model's own (Hermes) format: a random model writes it in ~100 tokens
    call = first.choices[0].message.tool_calls[0]
    result = get_weather(**json.loads(call.function.arguments))
    msgs += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = client.chat.completions.create(model=model, messages=msgs, tools=tools, max_tokens=8)
    assert second.choices[0].message.role == "assistant" and second.usage.prompt_tokens > first.usage.prompt_tokens
    body = dict(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=80, temperature=0, response_format=ASCII
    )
    chunks = [
        c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True) if c.choices
    ]
    assert "".join(chunks) == client.chat.completions.create(**body).choices[0].message.content
    # streaming with tools: the call's name, then its arguments, as OpenAI's deltas; assembled they
    # are the non-streamed greedy answer's call
    forced = dict(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=0,
    )
    name, args, reasons = "", "", []
    for chunk in client.chat.completions.create(**forced, stream=True):
        for c in chunk.choices:
            reasons.append(c.finish_reason)
            for d in c.delta.tool_calls or []:
                name += (d.function.name or "") if d.function else ""
                args += (d.function.arguments or "") if d.function else ""
    whole = client.chat.completions.create(**forced).choices[0].message.tool_calls[0]
    assert (name, json.loads(args)) == (whole.function.name, json.loads(whole.function.arguments))
    assert reasons[-1] == "stop"  # a named tool_choice answers "stop", as OpenAI does
    resp = client.responses.create(model=model, input="Hi", max_output_tokens=5)
    assert resp.output_text is not None


def test_the_printed_sdk_snippet_runs_as_pasted(live):
    from loraplex.platform.demo.bootstrap import demo_snippets

    base_url, key, model = live
    snippet = demo_snippets(base_url.removesuffix("/v1"), key, model)
    python_part = snippet[snippet.index("\n\n") + 2 :]  # the curl command, then the SDK script
    done = subprocess.run(["bash", "-c", python_part], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------- langchain
def test_langchain_openai(live):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    base_url, key, model = live
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=key, max_tokens=60, max_retries=0, timeout=120)
    out = llm.with_structured_output(Weather, method="json_schema").invoke("Weather in Paris?")
    assert isinstance(out, Weather)
    with_tools = llm.bind_tools([Weather], tool_choice="Weather")  # the tool's schema bounds its arguments
    msgs: list = [HumanMessage("Weather in Paris?")]
    ai = with_tools.invoke(msgs)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "Weather", ai
    call = ai.tool_calls[0]
    msgs += [ai, ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"])]
    final = llm.bind_tools([Weather]).invoke(msgs)
    assert final.type == "ai" and CALLS
    # streaming with tools: langchain's tool_call_chunks add up to the call of the same greedy request
    greedy_tools = ChatOpenAI(
        model=model, base_url=base_url, api_key=key, max_tokens=60, temperature=0, max_retries=0
    ).bind_tools([Weather], tool_choice="Weather")
    chunks = list(greedy_tools.stream([HumanMessage("Weather in Paris?")]))
    assert any(c.tool_call_chunks for c in chunks)
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    whole = greedy_tools.invoke([HumanMessage("Weather in Paris?")])
    assert [(t["name"], t["args"]) for t in total.tool_calls] == [(t["name"], t["args"]) for t in whole.tool_calls]
    greedy = ChatOpenAI(model=model, base_url=base_url, api_key=key, max_tokens=80, temperature=0, max_retries=0)
    pieces = [c.content for c in greedy.stream("Hi", response_format=ASCII)]
    # It streams (an iterator of chunks); how many depends on how far the client lags the engine,
    # which coalesces its deltas for a slow reader: one chunk is legal on a loaded machine.
    assert [p for p in pieces if p]
    assert "".join(pieces) == greedy.invoke("Hi", response_format=ASCII).content  # type: ignore[operator]


# ---------------------------------------------------------------------------------------- instructor
def test_instructor(live):
    import instructor

    base_url, key, model = live
    raw = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    client = instructor.from_openai(raw, mode=instructor.Mode.TOOLS)  # a named tool_choice per model
    w = client.chat.completions.create(
        model=model,
        response_model=Weather,
        messages=[{"role": "user", "content": "Weather?"}],
        max_tokens=60,
        max_retries=0,
    )
    assert isinstance(w, Weather)
    # the tool round trip: instructor's call, run here, the result sent back as a tool message
    first = raw.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[{"type": "function", "function": instructor.openai_schema(Weather).openai_schema}],
        tool_choice={"type": "function", "function": {"name": "Weather"}},
        max_tokens=60,
    )
    call = first.choices[0].message.tool_calls[0]
    parsed = Weather.model_validate_json(call.function.arguments)
    assistant = {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]}
    follow = client.chat.completions.create(
        model=model,
        response_model=Weather,
        max_tokens=60,
        max_retries=0,
        messages=[
            {"role": "user", "content": "Weather?"},
            assistant,
            {"role": "tool", "tool_call_id": call.id, "content": get_weather(parsed.city, parsed.days)},
        ],
    )
    assert isinstance(follow, Weather)
    partials = list(
        client.chat.completions.create_partial(
            model=model,
            response_model=Weather,
            messages=[{"role": "user", "content": "Weather?"}],
            max_tokens=60,
            max_retries=0,
        )
    )
    assert len(partials) >= 2 and Weather.model_validate(partials[-1].model_dump())


# ---------------------------------------------------------------------------------------- pydantic-ai
def test_pydantic_ai(live):
    from pydantic_ai import Agent, ModelRequest, ToolReturnPart
    from pydantic_ai.direct import model_request_sync
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.tools import ToolDefinition

    base_url, key, model_name = live
    provider = OpenAIProvider(base_url=base_url, api_key=key)
    chat_model = OpenAIChatModel(model_name, provider=provider)
    # the output tool is a `required` call in the model's own (Hermes) format: ~100 random tokens
    settings = {"max_tokens": 200, "parallel_tool_calls": False}
    out = Agent(chat_model, output_type=Weather, model_settings=settings).run_sync("Weather?").output  # type: ignore[arg-type]
    assert isinstance(out, Weather)
    responses_out = Agent(
        OpenAIResponsesModel(model_name, provider=provider),
        output_type=Weather,
        model_settings=settings,  # type: ignore[arg-type]
    ).run_sync("Weather?")
    assert isinstance(responses_out.output, Weather)
    # tool round trip through pydantic-ai's own message mapping: a forced call, run here, returned
    tool = ToolDefinition(name="get_weather", parameters_json_schema=WEATHER_SCHEMA, description="weather")
    params = ModelRequestParameters(function_tools=[tool], allow_text_output=False)
    history: list = [ModelRequest.user_text_prompt("Weather in Paris?")]
    first = model_request_sync(
        chat_model,
        history,
        model_settings={**settings, "tool_choice": ["get_weather"]},
        model_request_parameters=params,  # type: ignore[typeddict-item]
    )
    call = first.tool_calls[0]
    result = get_weather(**call.args_as_dict())
    history += [first, ModelRequest(parts=[ToolReturnPart("get_weather", result, tool_call_id=call.tool_call_id)])]
    second = model_request_sync(
        chat_model,
        history,
        model_settings={"max_tokens": 8},
        model_request_parameters=ModelRequestParameters(function_tools=[tool]),
    )
    assert second.usage.input_tokens > first.usage.input_tokens

    async def stream() -> list[str]:
        agent = Agent(
            OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key=key)),
            model_settings={"max_tokens": 80, "temperature": 0, "extra_body": {"response_format": ASCII}},
        )
        async with agent.run_stream("Hi") as r:
            return [t async for t in r.stream_text(delta=True)]

    # It streams (text deltas); how many depends on how far the client lags the engine, which
    # coalesces its deltas for a slow reader: one is legal on a loaded machine.
    pieces = asyncio.run(stream())
    assert [p for p in pieces if p] and json.loads("".join(pieces))

    async def stream_with_tools() -> tuple[list, object]:
        # a structured output is a tool call for pydantic-ai: streamed, it is validated as it grows
        agent = Agent(
            OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key=key)),
            output_type=Weather,
            model_settings=settings,  # type: ignore[arg-type]
        )
        async with agent.run_stream("Weather?") as r:
            partials = [o async for o in r.stream_output(debounce_by=None)]
            return partials, await r.get_output()

    partials, final_output = asyncio.run(stream_with_tools())
    assert partials and isinstance(final_output, Weather)


def test_pydantic_ai_native_output_beside_a_tool(live):
    """pydantic-ai's NativeOutput + a tool: the request carries ``tools`` and ``response_format``
    (``tool_choice`` auto), and the answer is a tool call OR the schema'd JSON, as OpenAI answers
    (the schema alone used to constrain it: the tool ran 0 times). Which one a random model picks
    is its draw, so several seeded runs; the tool is offered until it has run once (pydantic-ai's
    ``prepare``), so a random model cannot call it until the context is full. Every run ends with
    a valid ``Weather``; in some the tool runs (its result sent back to the server), in others the
    first answer is the JSON."""
    from pydantic_ai import Agent, NativeOutput, RunContext, Tool
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.tools import ToolDefinition

    async def until_it_ran(ctx: RunContext, tool: ToolDefinition) -> ToolDefinition | None:
        return None if CALLS else tool

    base_url, key, model_name = live
    model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url, api_key=key))
    calls_per_run = []
    for seed in range(16):  # stops once both answers were seen (seed 3 calls, on this machine)
        CALLS.clear()
        agent = Agent(
            model,
            output_type=NativeOutput(Weather),
            tools=[Tool(get_weather, prepare=until_it_ran)],
            model_settings={"max_tokens": 200, "temperature": 1.0, "seed": seed},
        )
        result = agent.run_sync("Weather in Paris?")
        assert isinstance(result.output, Weather)
        calls_per_run.append(len(CALLS))
        if any(calls_per_run) and not all(calls_per_run):
            break
    assert any(calls_per_run) and not all(calls_per_run), calls_per_run  # a call, and the JSON answer


# ---------------------------------------------------------------------------------------- openai-agents
def test_openai_agents_default_responses_model(live):
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    base_url, key, model_name = live
    set_tracing_disabled(True)  # nothing leaves the machine
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": ASCII["json_schema"]["schema"]}}  # type: ignore[index]

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
        set_default_openai_client(client, use_for_tracing=False)
        structured = await Runner.run(
            Agent(name="s", model=model_name, output_type=Weather, model_settings=ModelSettings(max_tokens=80)),
            "Weather?",
        )
        assert isinstance(structured.final_output, Weather)
        agent = Agent(
            name="t",
            model=model_name,
            tools=[function_tool(get_weather)],
            # forced on the first turn; the SDK resets tool_choice once a tool ran (reset_tool_choice)
            model_settings=ModelSettings(tool_choice="get_weather", max_tokens=80),
        )
        result = await Runner.run(agent, "Weather in Paris?", max_turns=3)
        assert CALLS and isinstance(result.final_output, str)
        kinds = [i.type for i in result.new_items]
        assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
        streamed = Runner.run_streamed(
            Agent(
                name="x",
                model=model_name,
                model_settings=ModelSettings(max_tokens=80, temperature=0, extra_body={"text": fmt}),
            ),
            "Hi",
        )
        deltas = [
            ev.data.delta
            async for ev in streamed.stream_events()
            if ev.type == "raw_response_event" and ev.data.type == "response.output_text.delta"
        ]
        assert deltas and "".join(deltas) == streamed.final_output
        # streaming with tools: the call's argument deltas arrive as Responses events and the SDK
        # runs the tool (the run stops there: a random model's free text after it may run into
        # max_output_tokens, which a streamed run reports as an error)
        CALLS.clear()
        stop_at_tool = agent.clone(tool_use_behavior="stop_on_first_tool")
        with_tools = Runner.run_streamed(stop_at_tool, "Weather in Paris?", max_turns=3)
        events = [ev async for ev in with_tools.stream_events()]
        arg_deltas = [
            ev.data.delta
            for ev in events
            if ev.type == "raw_response_event" and ev.data.type == "response.function_call_arguments.delta"
        ]
        assert arg_deltas and CALLS and json.loads("".join(arg_deltas)) == {"city": CALLS[0][0], "days": CALLS[0][1]}
        assert any(ev.type == "run_item_stream_event" and ev.item.type == "tool_call_output_item" for ev in events)
        assert with_tools.final_output == get_weather(*CALLS[0])  # the tool's own result ended the run

    asyncio.run(main())  # the default model class is OpenAIResponsesModel: /v1/responses
