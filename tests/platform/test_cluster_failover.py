"""``RemoteStream`` resuming from its checkpoint, without Ray's processes: the "replicas" are calls
into one real engine (``AsyncEngine`` of the demo model, exactly as ``EngineReplica.generate``
feeds it: the ``GenerateRequest``, ``resume_token_ids``, DELTA outputs), and a replica's death is the very
exception Ray raises on a dead actor's stream. The oracle is the same request run uninterrupted.
The real kill -9 of a replica process is ``test_scale_out.py``'s."""

from __future__ import annotations

import asyncio

import pytest

from loraplex.engine import AsyncEngine, EngineConfig, EngineRequest, OutputKind, SamplingParams
from loraplex.platform.cluster.messages import Accepted, GenerateRequest, Output, StreamChunk, StreamError
from loraplex.platform.cluster.remote_stream import MAX_LOSSES, RemoteStream
from loraplex.platform.errors import BadRequest, PlatformError, ServiceUnavailable

ray_exceptions = pytest.importorskip("ray.exceptions", reason="the scale-out code needs loraplex[ray]")

PROMPT = [11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    eng = AsyncEngine(
        EngineConfig(model=str(demo_model_dir), max_num_seqs=8, block_size=8, num_kv_blocks=256, dtype="float32")
    ).start()
    yield eng
    eng.shutdown()


class _Call:
    """One call to an engine "replica": Serve's streaming response, as the ingress sees it. It
    dies (the exception of a SIGKILLed actor) after ``die_after`` outputs, if given."""

    def __init__(self, engine: AsyncEngine, req: GenerateRequest, die_after: int | None, how: str = "actor") -> None:
        self.req, self.die_after, self.how = req, die_after, how
        self.stream = engine.submit(
            EngineRequest(
                req.prompt_ids,
                req.params,
                request_id=req.request_id,
                output_kind=OutputKind.DELTA,
                resume_token_ids=list(req.resume_token_ids or ()),
            )
        )
        self.engine, self.sent = engine, -1

    async def __anext__(self) -> StreamChunk:
        if self.sent == -1:
            self.sent = 0
            return Accepted(f"engine-{self.req.request_id}")
        if self.die_after is not None and self.sent >= self.die_after:
            self.engine.abort(self.req.request_id)
            if self.how == "engine":  # the replica lives, its engine loop died: what it yields then
                self.die_after = None
                return StreamError.of(ServiceUnavailable("engine dead", code=StreamError.ENGINE_UNAVAILABLE))
            raise ray_exceptions.ActorDiedError()
        self.sent += 1
        return Output(await self.stream.__anext__())

    def cancel(self) -> None:
        self.engine.abort(self.req.request_id)


def _replicas(engine: AsyncEngine, deaths: list[int | None], how: str = "actor"):
    """A call function whose k-th call dies after ``deaths[k]`` outputs (None: lives); records
    each call's request."""
    calls: list[GenerateRequest] = []

    def call(req: GenerateRequest, adapter: str) -> _Call:
        calls.append(req)
        return _Call(engine, req, deaths[len(calls) - 1] if len(calls) <= len(deaths) else None, how)

    return call, calls


async def _read(stream: RemoteStream) -> tuple[list, list]:
    """Everything the reader (billing, the response) gets: per choice, tokens and texts; logprobs."""
    await stream.open()
    outs = [out async for out in stream]
    assert outs[-1].finished
    return outs, [lp for o in outs for c in o.outputs for lp in (c.logprobs or [])]


def _tokens(outs, index=0) -> list[int]:
    return [t for o in outs for c in o.outputs if c.index == index for t in c.token_ids]


def _text(outs, index=0) -> str:
    return "".join(c.text for o in outs for c in o.outputs if c.index == index)


def _req(rid: str, params: SamplingParams) -> GenerateRequest:
    return GenerateRequest(PROMPT, params, rid, "t", None, version=0, adapter=None)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=1),
        SamplingParams(max_tokens=40, temperature=1.0, seed=77, ignore_eos=True, logprobs=1),
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=["e t", "xyz"]),
    ],
    ids=["greedy", "seeded", "stop-strings"],
)
async def test_two_replicas_die_mid_stream_the_reader_sees_the_uninterrupted_answer(engine, params):
    call, _ = _replicas(engine, [])
    whole, whole_lps = await _read(RemoteStream(call, lambda rid: None, _req("w", params), "", 5.0))
    call, calls = _replicas(engine, [3, 4])  # the first replica dies after 3 outputs, the next after 4
    done: list[str] = []
    outs, lps = await _read(RemoteStream(call, done.append, _req("r", params), "", 5.0))
    assert len(calls) == 3
    first, second = calls[1].resume_token_ids or [], calls[2].resume_token_ids or []
    assert first == _tokens(outs)[: len(first)]
    assert 0 < len(first) < len(second)
    assert _tokens(outs) == _tokens(whole) and _text(outs) == _text(whole)
    assert outs[-1].outputs[0].finish_reason == whole[-1].outputs[0].finish_reason
    assert all(o.request_id == "r" for o in outs) and "r" in done
    # every token once: the replay's placeholder logprobs never reach the reader
    assert [lp.token_id for lp in lps] == [lp.token_id for lp in whole_lps]


async def test_n2_before_the_first_token_is_retried_after_a_token_is_a_503(engine):
    params = SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    call, calls = _replicas(engine, [0])  # dies before any output: a plain retry
    outs, _ = await _read(RemoteStream(call, lambda rid: None, _req("n2a", params), "", 5.0))
    assert len(calls) == 2 and calls[1].resume_token_ids is None
    assert len(_tokens(outs, 0)) == len(_tokens(outs, 1)) == 12
    call, calls = _replicas(engine, [2])
    stream = RemoteStream(call, lambda rid: None, _req("n2b", params), "", 5.0)
    await stream.open()
    got = [await stream.__anext__(), await stream.__anext__()]
    assert sum(len(c.token_ids) for o in got for c in o.outputs) > 0
    with pytest.raises(ServiceUnavailable, match="n > 1"):
        await stream.__anext__()
    assert len(calls) == 1


async def test_a_request_that_keeps_losing_replicas_fails_cleanly(engine):
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    call, calls = _replicas(engine, [1] * 10)
    stream = RemoteStream(call, lambda rid: None, _req("lossy", params), "", 5.0)
    with pytest.raises(ServiceUnavailable, match="replicas lost"):
        await asyncio.wait_for(_read(stream), 60)
    assert len(calls) == MAX_LOSSES


async def test_a_replica_whose_engine_loop_died_mid_stream_is_resumed_too(engine):
    params = SamplingParams(max_tokens=30, temperature=1.0, seed=3, ignore_eos=True)
    call, _ = _replicas(engine, [])
    whole, _ = await _read(RemoteStream(call, lambda rid: None, _req("e-whole", params), "", 5.0))
    call, calls = _replicas(engine, [4], how="engine")
    outs, _ = await _read(RemoteStream(call, lambda rid: None, _req("e-cut", params), "", 5.0))
    assert len(calls) == 2 and calls[1].resume_token_ids
    assert _tokens(outs) == _tokens(whole) and _text(outs) == _text(whole)


class _Refusing:
    """A replica that refuses the request the way ``EngineReplica.generate`` reports a platform
    error: one ``StreamError`` instead of ``Accepted``."""

    def __init__(self, error: PlatformError) -> None:
        self.error, self.cancelled = error, False

    async def __anext__(self) -> StreamChunk:
        return StreamError.of(self.error)

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.parametrize(
    "error",
    [
        BadRequest("prompt too long", param="prompt", code="context_length_exceeded"),
        ServiceUnavailable("busy", headers={"retry-after": "7"}),
    ],
    ids=["400", "503"],
)
async def test_a_replica_refusal_is_raised_again_as_the_same_platform_error(error):
    """What crosses the wire is the error's HTTP meaning; the ingress raises the platform error of
    that status with the same message, param, code, type and headers (the client's 4xx/503 body
    is the same as from one process), and asks no other replica."""
    calls: list[GenerateRequest] = []

    def call(req: GenerateRequest, adapter: str) -> _Refusing:
        calls.append(req)
        return _Refusing(error)

    params = SamplingParams(max_tokens=4)
    stream = RemoteStream(call, lambda rid: None, _req("refused", params), "", 5.0)
    with pytest.raises(type(error)) as got:
        await stream.open()
    exc = got.value
    assert (exc.status_code, exc.type, exc.message, exc.param, exc.code, exc.headers) == (
        error.status_code,
        error.type,
        error.message,
        error.param,
        error.code,
        error.headers,
    )
    assert len(calls) == 1
