"""Chat completion chunks -> the Responses API's stream events, as OpenAI sends them: an output
item (message or function_call) is added when its first piece arrives, its text / arguments stream
as deltas, and everything is closed (``*.done``) before ``response.completed``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from loraplex.platform.inference.responses_api.convert import call_item, message_item, new_id


def _chunks(raw: AsyncIterable[Any]) -> AsyncIterator[dict[str, Any]]:
    async def gen() -> AsyncIterator[dict[str, Any]]:
        buf = ""
        async for piece in raw:
            buf += piece.decode() if isinstance(piece, bytes) else piece
            while "\n\n" in buf:
                event, buf = buf.split("\n\n", 1)
                for line in event.splitlines():
                    if line.startswith("data: ") and line[6:] != "[DONE]":
                        yield json.loads(line[6:])

    return gen()


class EventWriter:
    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, type_: str, **payload: Any) -> str:
        data = {"type": type_, "sequence_number": self.seq, **payload}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def translate(
    raw: AsyncIterable[Any],
    start: dict[str, Any],
    finish: Callable[[list[dict[str, Any]], dict[str, Any] | None, str | None], Any],
) -> AsyncIterator[str]:
    """``start``: the in-progress Response; ``finish(output, chat_usage, finish_reason)`` stores and
    returns the final Response (awaitable)."""
    ev = EventWriter()
    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    items: list[dict[str, Any]] = []  # output items in order, as they will be in the Response
    text_item: dict[str, Any] | None = None
    calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item
    usage: dict[str, Any] | None = None
    reason: str | None = None
    async for chunk in _chunks(raw):
        if "error" in chunk:
            err = chunk["error"]
            yield ev("error", code=err.get("code"), message=err.get("message"), param=err.get("param"))
            yield ev("response.failed", response={**start, "status": "failed", "error": err})
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            reason = choice.get("finish_reason") or reason
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if text_item is None:
                    text_item = message_item("", status="in_progress")
                    items.append(text_item)
                    shell = {**text_item, "content": []}
                    yield ev("response.output_item.added", output_index=len(items) - 1, item=shell)
                    part = {"type": "output_text", "text": "", "annotations": []}
                    yield ev(
                        "response.content_part.added",
                        item_id=text_item["id"],
                        output_index=len(items) - 1,
                        content_index=0,
                        part=part,
                    )
                text_item["content"][0]["text"] += delta["content"]
                yield ev(
                    "response.output_text.delta",
                    item_id=text_item["id"],
                    output_index=items.index(text_item),
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                )
            for tc in delta.get("tool_calls") or []:
                item = calls.get(tc["index"])
                if item is None:
                    fn = tc.get("function") or {}
                    item = call_item(tc.get("id") or new_id("call"), fn.get("name", ""), "", status="in_progress")
                    calls[tc["index"]] = item
                    items.append(item)
                    yield ev("response.output_item.added", output_index=len(items) - 1, item=dict(item))
                piece = (tc.get("function") or {}).get("arguments") or ""
                if piece:
                    item["arguments"] += piece
                    yield ev(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=items.index(item),
                        delta=piece,
                    )
    for k, item in enumerate(items):
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            yield ev(
                "response.output_text.done",
                item_id=item["id"],
                output_index=k,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            yield ev("response.content_part.done", item_id=item["id"], output_index=k, content_index=0, part=part)
        else:
            yield ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=k,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield ev("response.output_item.done", output_index=k, item=item)
    final = await finish(items, usage, reason)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield ev(kind, response=final)
