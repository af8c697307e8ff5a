"""Demo training examples as token ids and labels, rendered exactly as the server renders a chat.

An example is a whole conversation: ``(messages, tools, answer)``. Every assistant turn in it is a
target: the calls an agent makes, and after each tool result the next call or the final plain-text
answer (that last turn is what a small adapter trained only on first turns never learns: it calls
the tool again and the agent loop never ends). The loss is on assistant tokens only; the prompt,
the tool list and the tool results are context.
"""

from __future__ import annotations

from typing import Any

from loraplex.platform.demo.chat_template import DEMO_CHAT_TEMPLATE, tool_call_text
from loraplex.platform.demo.tool_dataset import Example

IGNORE = -100


def response_schema(example: Example) -> dict[str, Any] | None:
    """The JSON schema the example's request asks the answer to follow (``response_format``), if any."""
    return example[3] if len(example) == 4 else None


def prompt_text(tokenizer, example: Example) -> str:
    """The prompt of one example's final turn, rendered as the server renders a chat request
    (the answer's schema reaches the template as ``response_schema`` when tools are offered too)."""
    messages, tools, _answer = example[:3]
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    schema = response_schema(example)
    if tools and schema is not None:
        kwargs["response_schema"] = schema
    return tokenizer.apply_chat_template(
        messages, chat_template=DEMO_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True, **kwargs
    )


def assistant_text(message: dict[str, Any]) -> str:
    """What the model writes for an assistant message of the history (as the template renders it)."""
    calls = message.get("tool_calls") or []
    return (message.get("content") or "") + "".join(
        tool_call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls
    )


def turns(example: Example) -> list[tuple[Example, str]]:
    """(the example cut before an assistant turn, that turn's text) for every assistant turn."""
    messages, tools, answer = example[:3]
    schema = response_schema(example)
    cuts = [(messages[:j], m) for j, m in enumerate(messages) if m["role"] == "assistant"]
    out: list[tuple[Example, str]] = [
        ((cut, tools, "") if schema is None else (cut, tools, "", schema), assistant_text(m)) for cut, m in cuts
    ]
    return out + [(example, answer)]


def _encode(tokenizer, example: Example) -> tuple[list[int], list[int]]:
    """One sequence for the whole conversation, labels on every assistant turn. Raises ValueError
    when the renderings do not nest token for token (a tokenizer without the template's special
    tokens): ``sequences`` then trains each turn on its own."""
    ids: list[int] = []
    labels: list[int] = []
    for cut, target in turns(example):
        prompt = tokenizer.encode(prompt_text(tokenizer, cut), add_special_tokens=False)
        if prompt[: len(ids)] != ids:
            raise ValueError("the conversation's renderings do not nest")
        labels += [IGNORE] * (len(prompt) - len(ids))
        answer = tokenizer.encode(target, add_special_tokens=False) + [tokenizer.eos_token_id]
        ids = prompt + answer
        labels += answer
    return ids, labels


def sequences(tokenizer, example: Example) -> list[tuple[list[int], list[int]]]:
    """The training sequences of one example: the whole conversation in one when it nests (each
    turn's prompt is the previous one plus its answer), else one per assistant turn."""
    try:
        return [_encode(tokenizer, example)]
    except ValueError:
        out = []
        for cut, target in turns(example):
            prompt = tokenizer.encode(prompt_text(tokenizer, cut), add_special_tokens=False)
            answer = tokenizer.encode(target, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append((prompt + answer, [IGNORE] * len(prompt) + answer))
        return out
