"""AsyncEngine: the background step loop a server drives."""

from __future__ import annotations

import asyncio

import pytest
from harness.wait import wait_for_async

from loraplex.engine import LLM, AsyncEngine, EngineConfig, InvalidRequestError, SamplingParams


@pytest.fixture
def engine(tiny_llama):
    eng = AsyncEngine(EngineConfig(model=tiny_llama, max_num_seqs=8, block_size=8, num_kv_blocks=128)).start()
    yield eng
    eng.shutdown()


async def test_stream_is_incremental_and_matches_offline(engine, tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    seen = []
    async for out in engine.submit([5, 6, 7, 8], params, tenant_id="acme"):
        seen.append(list(out.token_ids))
    final = seen[-1]
    assert len(final) == 12
    # cumulative outputs: each is a prefix of the next
    for a, b in zip(seen, seen[1:]):
        assert b[: len(a)] == a and len(b) > len(a)
    offline = LLM(model=tiny_llama, num_kv_blocks=64, block_size=8).generate([[5, 6, 7, 8]], params)[0]
    assert final == offline.token_ids


async def test_concurrent_requests_join_running_batch(engine):
    # The first request is long enough that it is surely still decoding when the second arrives,
    # however the engine thread and the event loop happen to interleave.
    first = engine.submit([5] * 10, SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True))
    first_out = await first.__anext__()
    # A request submitted while the first is decoding joins the same batch (continuous batching).
    second = engine.submit([6] * 10, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    final2 = [o async for o in second][-1]
    rest = [o async for o in first]
    assert rest[-1].finished and len(rest[-1].token_ids) == 300
    assert final2.finished and len(final2.token_ids) == 8
    assert first_out.metrics["first_token_time"] <= final2.metrics["first_token_time"]
    # the short request started AND finished while the long one was still running
    assert final2.metrics["finish_time"] < rest[-1].metrics["finish_time"]


async def test_abort_frees_blocks_and_ends_stream(engine):
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    stream = engine.submit([5] * 30, params, request_id="to-abort")
    await stream.__anext__()
    assert engine.abort("to-abort")
    outs = [o async for o in stream]
    assert outs[-1].finish_reason == "abort"
    for _ in range(50):
        stats = engine.stats()
        if stats["kv_cache"]["used_blocks"] == 0:
            break
        await asyncio.sleep(0.02)
    assert stats["kv_cache"]["used_blocks"] == 0
    assert stats["scheduler"]["num_running"] == 0


async def test_closing_stream_early_aborts(engine):
    stream = engine.submit(
        [5] * 8, SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True, n=1), request_id="client-gone"
    )
    await stream.__anext__()
    await stream.aclose()  # what a server does when the client disconnects
    await wait_for_async(lambda: engine.stats()["kv_cache"]["used_blocks"] == 0, what="the blocks to be freed")


async def test_bad_request_raises_at_submit_and_engine_keeps_serving(engine):
    with pytest.raises(InvalidRequestError):
        engine.submit([], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError):
        engine.submit([5], SamplingParams(max_tokens=10_000_000))
    out = await engine.generate([5, 6], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 3


async def test_streamed_text_has_no_partial_characters(engine):
    texts = []
    async for out in engine.submit("Hello, world", SamplingParams(max_tokens=16, temperature=1.0, seed=5)):
        texts.append(out.text)
    assert out.finished
    # A character split across tokens is held back until complete, so nothing streamed is ever taken
    # back: every streamed text is a prefix of the final one. (A random model can also sample a byte
    # sequence that is not UTF-8 at all; its U+FFFD is final and stays.)
    for t in texts:
        assert texts[-1].startswith(t)
    assert texts[-1] == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
