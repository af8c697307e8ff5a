"""A chat request -> prompt token ids: which template (the request's, the server's, the
tokenizer's), what it is given (messages, tools, vLLM's ``chat_template_kwargs``), and how it ends
(``add_generation_prompt``, ``continue_final_message``, ``truncate_prompt_tokens``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loraplex.platform.demo.chat_template import default_template
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatRequest
from loraplex.platform.inference.tools import ToolPlan, template_messages

# Arguments the renderer sets itself: a request's chat_template_kwargs may not replace them.
_RESERVED = {
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "chat_template",
}


def server_template(setting: str, model_dir: Path | None = None) -> str | None:
    """``[openai] chat_template``: a file path or the Jinja text itself; empty = the demo model's
    tool-aware template when serving the demo model, else the tokenizer's (None)."""
    if setting and "{" not in setting and Path(setting).is_file():
        setting = Path(setting).read_text()
    return default_template(setting or None, model_dir)


def check_request(body: ChatRequest, trust_request_template: bool) -> None:
    """Refusals that need no tokenizer (before admission does any work)."""
    if body.chat_template is not None and not trust_request_template:
        raise BadRequest(
            "a per-request chat_template is disabled on this server ([openai] trust_request_chat_template)",
            param="chat_template",
            code="unsupported_parameter",
        )
    if body.continue_final_message:
        if body.add_generation_prompt:
            raise BadRequest(
                "continue_final_message needs add_generation_prompt: false", param="continue_final_message"
            )
        if body.messages[-1].role != "assistant":
            raise BadRequest(
                "continue_final_message needs the last message to be the assistant's",
                param="continue_final_message",
            )
    bad = _RESERVED & set(body.chat_template_kwargs or {})
    if bad:
        raise BadRequest(
            f"chat_template_kwargs may not set {sorted(bad)[0]!r}: it has its own request field",
            param="chat_template_kwargs",
        )


def render(body: ChatRequest, tok: Any, plan: ToolPlan, default_template: str | None) -> list[int]:
    template = body.chat_template or default_template or tok.chat_template or ""
    kwargs: dict[str, Any] = dict(body.chat_template_kwargs or {})
    if plan.template_tools:
        kwargs["tools"] = plan.template_tools
        if plan.answer_schema is not None:  # a template that knows the variable shows it (the demo's does)
            kwargs.setdefault("response_schema", plan.answer_schema)
    if body.documents is not None:
        kwargs["documents"] = body.documents
    try:
        text = tok.apply_chat_template(
            template_messages(body, template),
            chat_template=template or None,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            tokenize=False,
            **kwargs,
        )
    except BadRequest:
        raise
    except Exception as exc:  # a template error (raise_exception, a Jinja error) is the request's fault
        raise BadRequest(f"the chat template failed: {exc}", param="messages", code="invalid_chat_template") from None
    ids = tok.encode(text, add_special_tokens=False)
    k = body.truncate_prompt_tokens
    return ids[-k:] if k is not None and len(ids) > k else ids
