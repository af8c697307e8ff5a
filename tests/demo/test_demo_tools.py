"""The demo model's tool-aware chat template (the server's default when it serves the demo model):
without tools it renders exactly the model's own template (the base model and the french/pirate
adapters see the same tokens); with tools, the server's renderer and /tokenize produce, token for
token, the prompts the tool-calling training data renders (platform/demo/train.py), and every
trained call is what the server's default parser (hermes) reads back as that call."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from loraplex.platform.demo.chat_template import DEMO_CHAT_TEMPLATE, default_template, is_demo_model
from loraplex.platform.demo.encode import response_schema
from loraplex.platform.demo.tool_dataset import examples
from loraplex.platform.demo.train import _encode, prompt_text
from loraplex.platform.inference.chat_prompt import render
from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.structured import response_spec
from loraplex.platform.inference.tool_parsers import get_parser
from loraplex.platform.inference.tools import parse_output, plan_tools

pytestmark = pytest.mark.slow  # the real 135M demo model's tokenizer (converted once per machine)


def on_the_wire(messages: list[dict]) -> list[dict]:
    """The training messages as an OpenAI client sends them (a call's arguments as a JSON string)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)


def test_demo_model_gets_the_tool_aware_template(smollm2_dir, tmp_path):
    assert is_demo_model(smollm2_dir) and default_template(None, smollm2_dir) == DEMO_CHAT_TEMPLATE
    assert default_template("{{ x }}", smollm2_dir) == "{{ x }}"  # the operator's template wins
    assert not is_demo_model(tmp_path) and default_template(None, tmp_path) is None  # another model: its own


def test_without_tools_it_is_the_models_own_template(tok):
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            own = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            demo = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen, chat_template=DEMO_CHAT_TEMPLATE
            )
            assert own == demo


def test_server_renders_the_training_prompts_and_reads_the_trained_calls(tok, smollm2_dir):
    template = default_template(None, smollm2_dir)
    data = examples()
    assert any(len(ex[0]) > 1 for ex in data)  # calls and tool results in the history too
    # tools beside a response_format schema: the template shows it (no such example is trained yet)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    data += [(ex[0], ex[1], '{"city":"Paris"}', schema) for ex in data[:3]]
    for example in data:
        messages, tools, answer = example[:3]
        request = {"model": "tools", "messages": on_the_wire(messages), "tools": tools}
        schema = response_schema(example)
        if schema is not None:
            request["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        body = ChatRequest.model_validate(request)
        served = render(body, tok, plan_tools(body, "hermes", response_spec(body)), template)
        ids, labels = _encode(tok, example)
        # The served prompt is the training example's prompt, and the loss starts right after it.
        assert served == ids[: len(served)] and labels[len(served) - 1] == -100 and labels[len(served)] != -100
        assert tok.decode(served) == prompt_text(tok, example)
        if answer.startswith("<tool_call>"):
            expected = json.loads(answer.split("\n")[1])
            _content, calls = parse_output(plan_tools(body, "hermes"), answer)
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [(expected["name"], expected["arguments"])]
        else:
            assert not get_parser("hermes").scan(answer, final=True).calls
            if schema is not None:  # the schema is in the prompt, and the answer is its JSON
                assert json.dumps(schema) in tok.decode(served) and set(json.loads(answer)) == set(schema["required"])
