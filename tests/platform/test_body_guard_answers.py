"""The body guard bounds the request body, never the answer.

Found running ``scripts/serve.sh`` (issue 32's "run it the way it ships"): every stream that lasted
longer than ``limits.body_idle_timeout_s`` (15 s) after its body was cut without an error or
``[DONE]``. The disconnect listener (``DisconnectWatch``, Starlette) keeps calling ``receive()``
after the body to learn when the client leaves; the guard put its idle deadline on that wait too,
raised its 408 there and from then on dropped every chunk the route sent. These tests drive the
guard with an ASGI app shaped like a streaming route: read the body, listen for the disconnect,
answer in chunks after the guard's idle time has passed."""

from __future__ import annotations

import asyncio

from loraplex.platform.http.body_guard import BodyGuard, BodyRule

IDLE_S = 0.05
RULE = BodyRule(max_bytes=1024, deadline_s=0.2, idle_s=IDLE_S, message="too large")


def streaming_app(chunks: int, listening: list[str]):
    async def app(scope, receive, send):
        while (await receive()).get("more_body", False):
            pass

        async def listen() -> None:  # what DisconnectWatch and Starlette do once the body is read
            message = await receive()
            listening.append(message["type"])

        listener = asyncio.create_task(listen())
        await asyncio.sleep(IDLE_S * 6)  # the answer takes longer than the body's idle time
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(chunks):
            await send({"type": "http.response.body", "body": b"chunk %d\n" % i, "more_body": True})
            await asyncio.sleep(IDLE_S)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        listener.cancel()

    return app


def run(app, body_parts: list[bytes], *, complete: bool = True) -> list[dict]:
    sent: list[dict] = []

    async def main() -> None:
        queue: asyncio.Queue[dict] = asyncio.Queue()
        for i, part in enumerate(body_parts):
            await queue.put(
                {"type": "http.request", "body": part, "more_body": i < len(body_parts) - 1 or not complete}
            )

        async def receive() -> dict:
            return await queue.get()  # after the body: blocks, as a client that stays connected

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        await BodyGuard(app, lambda _scope: RULE)(scope, receive, send)

    asyncio.run(main())
    return sent


def test_an_answer_longer_than_the_idle_time_is_sent_whole():
    listening: list[str] = []
    sent = run(streaming_app(chunks=8, listening=listening), [b'{"a":', b"1}"])
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = [m["body"] for m in sent[1:]]
    assert bodies[:8] == [b"chunk %d\n" % i for i in range(8)]  # the old guard sent none of them
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert listening == []  # the listener was still waiting, not told of a 408


def test_a_body_that_stops_arriving_still_gets_408():
    async def reader(scope, receive, send):
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"read", "more_body": False})

    sent = run(reader, [b'{"a":'], complete=False)  # the rest never comes
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [408]
