"""The chat renderer's inputs (platform/inference/chat_prompt.py): vLLM's ``documents`` reach the
template as a variable, may not be smuggled in through ``chat_template_kwargs``, and a template that
does not use them renders as without them; a model other than the demo model keeps its own template."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import chat_prompt
from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.tools import plan_tools

USES_DOCS = "{% for d in documents %}[{{ d['title'] }}:{{ d['text'] }}]{% endfor %}{{ messages[0]['content'] }}"


def _body(**extra) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "q"}], **extra})


def test_documents_reach_the_template(demo_model_dir):
    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    docs = [{"title": "a", "text": "one"}, {"title": "b", "text": "two"}]
    body = _body(documents=docs, chat_template=USES_DOCS)
    ids = chat_prompt.render(body, tok, plan_tools(body), None)
    assert tok.decode(ids) == "[a:one][b:two]q"
    # The tokenizer's own template ignores them: the same tokens as without them.
    plain, with_docs = _body(), _body(documents=docs)
    assert chat_prompt.render(with_docs, tok, plan_tools(with_docs), None) == chat_prompt.render(
        plain, tok, plan_tools(plain), None
    )
    # A non-demo model keeps its tokenizer's template.
    assert chat_prompt.server_template("", demo_model_dir) is None


def test_documents_are_not_a_template_kwarg():
    with pytest.raises(BadRequest) as err:
        chat_prompt.check_request(_body(chat_template_kwargs={"documents": []}), trust_request_template=False)
    assert err.value.param == "chat_template_kwargs"


SHOWS_SCHEMA = (
    "{% if response_schema is defined %}<{{ response_schema | tojson }}>{% endif %}{{ messages[0]['content'] }}"
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_the_answer_schema_reaches_the_template_beside_tools(demo_model_dir):
    """A response_format schema beside tools reaches the template as ``response_schema`` (the demo
    template shows it to the model: after a tool result the answer is that JSON, not another call);
    without tools, or with another constraint, the template gets nothing new."""
    from loraplex.platform.inference.structured import response_spec

    tok = AutoTokenizer.from_pretrained(str(demo_model_dir))
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}

    def text(**extra) -> str:
        body = _body(chat_template=SHOWS_SCHEMA, **extra)
        return tok.decode(chat_prompt.render(body, tok, plan_tools(body, "hermes", response_spec(body)), None))

    assert (
        text(tools=[TOOL], response_format=fmt)
        == '<{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}>q'
    )
    assert text(response_format=fmt) == "q"  # no tools: the template is as without a schema
    assert text(tools=[TOOL], response_format={"type": "json_object"}) == "q"
    assert text(tools=[TOOL], guided_json=SCHEMA) == text(tools=[TOOL], response_format=fmt)
    # the request's own chat_template_kwargs win
    assert text(tools=[TOOL], response_format=fmt, chat_template_kwargs={"response_schema": {"x": 1}}) == '<{"x": 1}>q'
