"""Responses API <-> chat: input items -> chat messages, tools and text.format -> the chat fields,
and a finished chat answer -> Response output items."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import ValidationError

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import TOOL_NAME_PATTERN, TOOL_NAME_RE, ChatRequest
from loraplex.platform.inference.responses_api.schemas import ResponsesRequest

_TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of parts", param=param)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and not isinstance(part.get("text"), str):
            missing = "text" not in part or part.get("text") is None
            raise BadRequest(  # a text part without its text is not an unsupported type
                f"Missing required parameter: '{param}[{j}].text'."
                if missing
                else f"Invalid type for '{param}[{j}].text': expected a string.",
                param=f"{param}[{j}].text",
                code="missing_required_parameter" if missing else "invalid_type",
            )
        if kind not in _TEXT_PARTS:
            raise BadRequest(
                f"content parts of type {kind!r} are not supported (text only)",
                param=f"{param}[{j}].type",
                code="unsupported_parameter",
            )
        out.append(part["text"])
    return "".join(out)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as chat messages (function calls and their outputs included)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}] if req.input else []
    msgs: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        kind = item.get("type", "message")
        param = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"unknown message role {role!r}", param=f"{param}.role")
            msgs.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or new_id("call")),
                "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments") or "{}")},
            }
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id", "")),
                    "content": output if isinstance(output, str) else _text(output, f"{param}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # this model writes no reasoning items; one sent back carries nothing to show
        else:
            raise BadRequest(f"input items of type {kind!r} are not supported", param=f"{param}.type")
    return msgs


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    out = []
    for i, t in enumerate(req.tools):
        if t.get("type") != "function":
            raise BadRequest(
                f"tools of type {t.get('type')!r} are not supported (function tools only)",
                param=f"tools[{i}].type",
                code="unsupported_parameter",
            )
        name = t.get("name")
        if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
            raise BadRequest(
                f"Invalid 'tools[{i}].name': string does not match pattern. Expected a string that matches "
                f"the pattern '{TOOL_NAME_PATTERN}'.",
                param=f"tools[{i}].name",
                code="invalid_value",
            )
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(f"tool_choice of type {choice.get('type')!r} is not supported", param="tool_choice")


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise BadRequest("text.format json_schema needs a schema", param="text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "response", "schema": fmt.schema_}}


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """(the chat request, the conversation to store: history + this input, without instructions,
    which OpenAI does not carry over to a follow-up response)."""
    conversation = history + input_messages(req)
    if not conversation:
        raise BadRequest("input is empty", param="input")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {
        "model": req.model,
        "messages": system + conversation,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_completion_tokens": req.max_output_tokens,
        "tools": _tools(req),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req),
        "user": req.user,
        "stream": req.stream,
        "stream_options": {"include_usage": True} if req.stream else None,
    }
    try:
        return ChatRequest.model_validate(body), conversation
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ()))
        raise BadRequest(f"{param}: {err.get('msg', 'invalid value')}", param=param or None) from None


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(call_id: str, name: str, arguments: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": item_id or new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_from_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    if message.get("content"):
        out.append(message_item(message["content"]))
    for c in message.get("tool_calls") or []:
        out.append(call_item(c["id"], c["function"]["name"], c["function"]["arguments"]))
    return out


def output_as_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a follow-up response continues from."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output
        if i["type"] == "function_call"
    ]
    if not text and not calls:
        return [{"role": "assistant", "content": ""}]
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def usage(chat_usage: dict[str, int] | None) -> dict[str, Any]:
    u = chat_usage or {}
    p, c = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": c,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": p + c,
    }


def response_object(
    req: ResponsesRequest,
    rid: str,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
    finish_reason: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    incomplete = status == "incomplete" or finish_reason == "length"
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text else {"type": "text"}
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at or int(time.time()),
        "status": "incomplete" if incomplete and status == "completed" else status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "model": req.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": None,
        "store": req.store,
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": _stored_tool_choice(req.tool_choice),
        "tools": _stored_tools(req),
        "top_p": req.top_p,
        "truncation": req.truncation,
        "usage": usage_,
        "user": req.user,
    }


def _stored_tools(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The tools as the chat request used them: a stored response keeps no other keys a client sent."""
    return [{"type": "function", **t["function"]} for t in _tools(req) or []]


def _stored_tool_choice(choice: Any) -> Any:
    if choice is None:
        return "auto"
    if isinstance(choice, dict):
        return {"type": "function", "name": str(choice.get("name", ""))}
    return choice


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
