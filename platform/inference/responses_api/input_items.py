"""``GET /v1/responses/{id}/input_items``: the items a stored response was generated from, as
OpenAI lists them (a cursor page: ``after``, ``limit`` 1-100, default 20, ``order`` default
``desc``).

The items are the stored conversation: every earlier response's input and output that
``previous_response_id`` carried over, then this request's input (instructions are not an item, as
in OpenAI). Their ids are derived from the response id and the position, so a cursor stays valid
for as long as the response is stored."""

from __future__ import annotations

from typing import Any, Literal

from loraplex.platform.errors import BadRequest


def items_of(response_id: str, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stem = response_id.removeprefix("resp_")
    items: list[dict[str, Any]] = []

    def item_id(prefix: str) -> str:
        return f"{prefix}_{stem}_{len(items)}"

    for msg in conversation:
        role = msg.get("role")
        content = msg.get("content")
        text = content if isinstance(content, str) else ""
        if role == "tool":
            items.append(
                {
                    "id": item_id("fco"),
                    "type": "function_call_output",
                    "call_id": str(msg.get("tool_call_id", "")),
                    "output": text,
                    "status": "completed",
                }
            )
        elif role == "assistant":
            calls = msg.get("tool_calls") or []
            if text or not calls:
                items.append(
                    {
                        "id": item_id("msg"),
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                )
            for call in calls:
                fn = call.get("function") or {}
                items.append(
                    {
                        "id": item_id("fc"),
                        "type": "function_call",
                        "call_id": str(call.get("id", "")),
                        "name": str(fn.get("name", "")),
                        "arguments": str(fn.get("arguments", "")),
                        "status": "completed",
                    }
                )
        else:
            items.append(
                {
                    "id": item_id("msg"),
                    "type": "message",
                    "role": role,
                    "status": "completed",
                    "content": [{"type": "input_text", "text": text}],
                }
            )
    return items


def page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> dict[str, Any]:
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise BadRequest("after: no input item of this response has that id", param="after")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
