"""The tool grammars (platform/inference/tool_grammar.py) as xgrammar's matcher sees them: which
outputs each one accepts, and where it lets the model END (its stop token accepted). Compiled
through the engine's own StructuredOutputManager, as a request's grammar is; read back through
the format's parser. Also: how plan_tools combines tools with an answer constraint, and identical
calls read back (and streamed) once."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from loraplex.engine import InvalidRequestError
from loraplex.engine.sampling_params import StructuredOutputSpec
from loraplex.engine.structured_output import StructuredOutputManager
from loraplex.platform.demo.chat_template import tool_call_text
from loraplex.platform.demo.tool_dataset import examples
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.tool_grammar import tool_grammar
from loraplex.platform.inference.tools import ToolStream, parse_output, plan_tools

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
TZ = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}
FUNCS = {"get_weather": CITY, "get_time": TZ}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in FUNCS.items()]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def hermes(name: str, args: dict) -> str:
    return tool_call_text(name, args)  # exactly what the demo template renders and the adapter writes


def llama(name: str, args: dict) -> str:
    return json.dumps({"name": name, "parameters": args})


W, T = hermes("get_weather", {"city": "Paris"}), hermes("get_time", {"tz": "UTC"})
LW, LT = llama("get_weather", {"city": "Paris"}), llama("get_time", {"tz": "CET"})


@pytest.fixture(scope="module")
def grammar(demo_model_dir):
    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    eos = tok.eos_token_id or 0
    mgr = StructuredOutputManager(tok, len(tok), [eos])

    def outcome(spec, text: str) -> str:
        """'end': accepted and the model may stop there; 'open': accepted, more must follow;
        'refused': the grammar does not accept it."""
        m = xgr.GrammarMatcher(mgr.compile(StructuredOutputSpec(*spec)))
        if not m.accept_string(text):
            return "refused"
        return "end" if m.accept_token(eos) and m.is_terminated() else "open"

    return outcome


def spec(mode: str, parser: str = "hermes", parallel: bool = True, answer=None, funcs=FUNCS):
    out = tool_grammar(mode, funcs, parser, parallel, answer)
    assert out is not None and out[0] == "structural_tag"
    return out


def test_required_may_end_after_every_complete_call(grammar):
    s = spec("required")
    assert grammar(s, W) == "end"  # one call, then the model's own end of turn
    assert grammar(s, W + T) == "end" and grammar(s, W + "\n" + T) == "end"  # parallel calls
    assert grammar(s, W + T + W) == "end"
    assert grammar(s, W[:-3]) == "open" and grammar(s, "") == "open"  # at least one, whole
    assert grammar(s, W.replace("\n</tool_call>", "</tool_call>")) == "end"
    for bad in (
        "Sure. " + W,  # calls only
        W + " done",
        hermes("get_news", {"city": "Paris"}),  # a tool that was not offered
        hermes("get_weather", {"town": "Paris"}),  # arguments off the schema
        hermes("get_time", {"tz": "PST"}),
        hermes("get_weather", {"city": "P" * 13}),  # maxLength, through the engine's rewrite
        W.replace('"city": "Paris"', '"city":        "Paris"'),  # bounded whitespace
    ):
        assert grammar(s, bad) == "refused", bad


def test_parallel_tool_calls_false_allows_exactly_one_call(grammar):
    for mode in ("required", "auto"):
        s = spec(mode, parallel=False)
        assert grammar(s, W) == "end" and grammar(s, T) == "end"
        assert grammar(s, W + T) == "refused" and grammar(s, W + "\n" + W) == "refused"


def test_auto_is_free_text_until_a_call_starts(grammar):
    s = spec("auto")
    assert grammar(s, "") == "end" and grammar(s, "It is sunny, I think.") == "end"
    assert grammar(s, W) == "end" and grammar(s, "Let me look. " + W) == "end"
    assert grammar(s, W + "\nChecking the time too. " + T) == "end"
    assert grammar(s, "<tool_call>\n" + '{"name": "get_news"') == "refused"
    assert grammar(s, hermes("get_weather", {"city": 5})) == "refused"


def test_auto_beside_an_answer_is_a_call_or_the_answer(grammar):
    s = spec("auto", answer=("json_schema", json.dumps(ANSWER)))
    assert grammar(s, '{"answer": "sunny"}') == "end" and grammar(s, W) == "end" and grammar(s, W + T) == "end"
    for bad in ("It is sunny.", '{"answer": 1}', W + '{"answer": "sunny"}', '{"answer": "x"}' + W, "Hm. " + W):
        assert grammar(s, bad) == "refused", bad
    assert grammar(spec("auto", answer=("json_object", "")), '{"x": [1]}') == "end"
    # A raw-text constraint (vLLM's guided_regex) is the whole output, calls included.
    body = ChatRequest.model_validate({"model": "m", "messages": MSGS, "tools": TOOLS})
    assert plan_tools(body, "hermes", ("regex", "(yes|no)")).spec == ("regex", "(yes|no)")


def test_llama3_json_calls_are_the_whole_output_or_none(grammar):
    req = spec("required", "llama3_json")
    assert grammar(req, LW) == "end" and grammar(req, LW + "; " + LT) == "end"
    assert grammar(req, "<|python_tag|>" + LW) == "end" and grammar(req, "Ok " + LW) == "refused"
    auto = spec("auto", "llama3_json")
    assert grammar(auto, "Paris is sunny.") == "end" and grammar(auto, LW + ";" + LT) == "end"
    assert grammar(auto, "Sure: " + LW) == "refused"  # its parser would read that as text
    assert grammar(auto, llama("get_news", {})) == "refused"


def test_formats_without_a_tagged_form_keep_the_json_array():
    assert tool_grammar("required", FUNCS, "mistral", True) is None
    assert tool_grammar("auto", FUNCS, "pythonic", True) is None
    for parser in ("mistral", "pythonic"):
        body = ChatRequest.model_validate({"model": "m", "messages": MSGS, "tools": TOOLS, "tool_choice": "required"})
        plan = plan_tools(body, parser)
        assert plan.spec is not None and plan.spec[0] == "json_schema" and json.loads(plan.spec[1])["type"] == "array"
        auto = ChatRequest.model_validate({"model": "m", "messages": MSGS, "tools": TOOLS})
        assert plan_tools(auto, parser).spec is None


def test_every_trained_demo_call_is_one_the_required_grammar_ends_after(grammar):
    """The tools demo adapter's calls (its training answers) are what the grammar accepts, and the
    grammar lets it stop right after one: the one-tool question ends with one call."""
    seen = 0
    for _messages, tools, answer, *_schema in examples():
        if tools and answer.startswith("<tool_call>"):
            funcs = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            assert grammar(spec("required", funcs=funcs), answer) == "end", answer
            seen += 1
            if seen == 5:
                break
    assert seen == 5


def _plan(**extra):
    body = ChatRequest.model_validate({"model": "m", "messages": MSGS, "tools": TOOLS, **extra})
    return plan_tools(body, "hermes", ("json_schema", json.dumps(ANSWER)) if "answer" not in extra else None)


def test_plan_combines_tools_and_the_answer_constraint(grammar):
    answer = ("json_schema", json.dumps(ANSWER))
    assert _plan(tool_choice="none").spec == answer  # the schema only
    auto = _plan()
    assert auto.mode == "auto" and grammar(auto.spec, '{"answer": "x"}') == "end" and grammar(auto.spec, W) == "end"
    required = _plan(tool_choice="required")  # the calls only
    assert grammar(required.spec, W) == "end" and grammar(required.spec, '{"answer": "x"}') == "refused"
    named = _plan(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.mode == "named" and grammar(named.spec, '{"tz": "CET"}') == "end"
    no_tools = ChatRequest.model_validate({"model": "m", "messages": MSGS})
    assert plan_tools(no_tools, "hermes", answer).spec == answer
    with pytest.raises(BadRequest):
        plan_tools(ChatRequest.model_validate({"model": "m", "messages": MSGS, "tool_choice": "required"}))


def _hermes_plan(parallel: bool = True):
    body = ChatRequest.model_validate(
        {"model": "m", "messages": MSGS, "tools": TOOLS, "parallel_tool_calls": parallel, "tool_choice": "required"}
    )
    return plan_tools(body, "hermes")


def test_identical_calls_are_read_back_once():
    plan = _hermes_plan()
    other = hermes("get_weather", {"city": "Oslo"})
    _, calls = parse_output(plan, W + W + "\n" + other + W.replace('"city": ', '"city":'))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    _, calls = parse_output(plan, W + T + T)
    assert [c.name for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize("step", [1, 3, 17])
def test_identical_calls_stream_once(step):
    """Streamed in pieces of any size: the repeat is never sent, and the distinct call after it
    keeps the next index."""
    text = W + W + T
    stream = ToolStream(_hermes_plan())
    calls: dict[int, dict] = {}
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    for k, piece in enumerate(pieces):
        delta, reason = stream.delta(piece, "stop" if k == len(pieces) - 1 else None)
        for tc in (delta or {}).get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
            slot["name"] = tc["function"].get("name") or slot["name"]
            slot["arguments"] += tc["function"].get("arguments", "")
        assert not (delta or {}).get("content")
    assert reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "UTC"}),
    ]


def test_a_tool_schema_the_grammar_cannot_compile_names_tools(demo_model_dir):
    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    mgr = StructuredOutputManager(tok, len(tok), [tok.eos_token_id or 0], max_spec_bytes=4096)
    bad = tool_grammar("auto", {"f": {"type": "foo"}}, "hermes", True)
    with pytest.raises(InvalidRequestError) as err:
        mgr.compile(StructuredOutputSpec(*bad))  # type: ignore[misc]
    assert err.value.param == "tools" and "foo" in str(err.value)
    big = tool_grammar("required", {f"t{i}": CITY for i in range(40)}, "hermes", True)
    with pytest.raises(InvalidRequestError) as err:
        mgr.compile(StructuredOutputSpec(*big))  # type: ignore[misc]
    assert err.value.param == "tools" and "limit" in str(err.value)
