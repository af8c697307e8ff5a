"""Speculative decoding inside the continuous, multi-LoRA batch: greedy output equals plain decoding
token for token (both proposers, several k, adapters mixed, chunked prefill and preemption in play),
a draft equal to the target accepts everything, seeded sampling is reproducible, opt-out, fair
charging of emitted tokens only, no prefix-cache hash over an unverified token, KV conservation."""

from __future__ import annotations

import random

import pytest
from lora_testlib import make_peft_adapter, make_small_draft

from loraplex.engine import LLM, EngineConfig, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint
from loraplex.engine.prefix_cache import SeqBlockHashes, extra_key

ADAPTERS = {
    "attn": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "mlp": dict(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"]),
}
# Tight on purpose: a 16-token budget chunks long prompts (and k+1 verification chunks compete for
# it), 36 blocks of 4 tokens force preemptions.
TIGHT = dict(
    dtype="float32",
    kernel_backend="torch",
    max_num_seqs=6,
    max_num_batched_tokens=16,
    block_size=4,
    num_kv_blocks=36,
    max_lora_rank=8,
)


@pytest.fixture(scope="module")
def setup(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    adapters = {
        n: make_peft_adapter(tiny_llama, root / n, seed=i + 1, **kw) for i, (n, kw) in enumerate(ADAPTERS.items())
    }
    draft = make_small_draft(root / "draft")
    return tiny_llama, adapters, draft


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Half random, half repetitive (spans that recur, so prompt lookup finds matches)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            span = [rng.randrange(5, 700) for _ in range(rng.randint(2, 5))]
            out.append((span * 8)[: rng.randint(6, 30)])
        else:
            out.append([rng.randrange(5, 700) for _ in range(rng.randint(1, 40))])
    return out


def _run(model, adapters, prompts, params, **kw):
    llm = LLM(model=model, **kw)
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    names = [None] + list(adapters)
    outs = llm.generate(prompts, params, adapters=[names[i % len(names)] for i in range(len(prompts))])
    return llm, [o.outputs[0].token_ids for o in outs]


def _assert_conserved(llm):
    llm.engine.step()  # an idle step lets the draft proposer release finished shadows
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    spec = llm.engine.spec
    if spec is not None and spec.draft is not None:
        assert spec.draft.kv.num_free_blocks == spec.draft.kv.num_blocks


@pytest.fixture(scope="module")
def plain(setup):
    model, adapters, _ = setup
    prompts = _prompts(12)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    _, outs = _run(model, adapters, prompts, params, **TIGHT)
    return prompts, params, outs


# The inner loop keeps n-gram k = 1 and 3 and draft k = 2; the longer proposals run in the whole suite.
@pytest.mark.parametrize(
    "method,k",
    [("ngram", 1), ("ngram", 3), pytest.param("ngram", 6, marks=pytest.mark.slow), ("draft", 2)]
    + [pytest.param("draft", 4, marks=pytest.mark.slow)],
)
def test_greedy_speculation_equals_plain_decoding(setup, plain, method, k):
    model, adapters, draft = setup
    prompts, params, expected = plain
    extra = {"draft_model": draft} if method == "draft" else {}
    llm, outs = _run(
        model, adapters, prompts, params, speculative_method=method, num_speculative_tokens=k, **extra, **TIGHT
    )
    for i, (got, exp) in enumerate(zip(outs, expected)):
        assert got == exp, f"prompt {i} diverged"
    st = llm.engine.stats()["speculative"]
    assert st["proposed_tokens"] > 0 and st["verifications"] > 0
    if method == "ngram":
        assert st["accepted_tokens"] > 0, "repetitive prompts must get some proposals accepted"
    assert llm.engine.counters["preemptions"] > 0, "the KV pool was meant to force preemption"
    assert 0.0 <= st["acceptance_rate"] <= 1.0
    assert st["mean_accepted_length"] == st["emitted_tokens"] / st["verifications"]
    _assert_conserved(llm)


@pytest.mark.slow
def test_draft_equal_to_target_accepts_everything(setup):
    model, adapters, _ = setup
    prompts = _prompts(6, seed=3)
    params = SamplingParams(max_tokens=17, temperature=0.0, ignore_eos=True)
    _, expected = _run(model, {}, prompts, params, dtype="float32", kernel_backend="torch")
    llm, outs = _run(
        model,
        {},
        prompts,
        params,
        dtype="float32",
        kernel_backend="torch",
        speculative_method="draft",
        draft_model=model,
        num_speculative_tokens=4,
    )
    assert outs == expected
    st = llm.engine.stats()["speculative"]
    assert st["acceptance_rate"] == 1.0 and st["accepted_tokens"] > 0
    # 17 tokens: 1 from the prefill, then 4 verifications of 4 accepted + 1 bonus each.
    assert llm.engine.counters["steps"] <= 1 + 4 + 1
    _assert_conserved(llm)
    # A stop token inside an accepted run ends the output exactly where plain decoding ends it.
    stop = expected[0][6]
    sp = SamplingParams(max_tokens=17, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    _, plain_stop = _run(model, {}, prompts, sp, dtype="float32", kernel_backend="torch")
    _, spec_stop = _run(
        model,
        {},
        prompts,
        sp,
        dtype="float32",
        kernel_backend="torch",
        speculative_method="draft",
        draft_model=model,
        num_speculative_tokens=4,
    )
    assert spec_stop == plain_stop and len(plain_stop[0]) <= 7


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_seeded_sampling_with_speculation_is_reproducible(setup, method):
    model, adapters, draft = setup
    prompts = _prompts(6, seed=4)
    extra = {"draft_model": draft} if method == "draft" else {}
    params = [
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=100 + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    runs = [
        _run(model, adapters, prompts, params, speculative_method=method, num_speculative_tokens=3, **extra, **TIGHT)
        for _ in range(2)
    ]
    assert runs[0][1] == runs[1][1]
    assert runs[0][0].engine.stats()["speculative"]["proposed_tokens"] > 0
    assert all(len(o) == 12 for o in runs[0][1])
    _assert_conserved(runs[0][0])


def test_per_request_opt_out(setup, plain):
    model, adapters, _ = setup
    prompts, params, expected = plain
    off = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, speculative=False)
    llm, outs = _run(model, adapters, prompts, off, speculative_method="ngram", **TIGHT)
    assert outs == expected
    assert llm.engine.stats()["speculative"]["proposed_tokens"] == 0


@pytest.mark.slow
def test_fair_policy_charges_emitted_tokens_only(setup):
    model, _, _ = setup
    prompts = _prompts(8, seed=5)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    counters = []
    for spec in ({}, {"speculative_method": "ngram", "num_speculative_tokens": 5}):
        llm = LLM(model=model, dtype="float32", kernel_backend="torch", scheduling_policy="fair", **spec)
        llm.generate(prompts, params, tenants=["a" if i % 3 else "b" for i in range(len(prompts))])
        counters.append(dict(llm.engine.policy.counters))
        if spec:
            assert (
                llm.engine.stats()["speculative"]["proposed_tokens"]
                > llm.engine.stats()["speculative"]["accepted_tokens"]
            ), "some proposals must be rejected"
    assert counters[0] == pytest.approx(counters[1])


@pytest.mark.slow
def test_prefix_cache_never_registers_an_unverified_token(setup):
    model, _, _ = setup
    prompts = _prompts(10, seed=6)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(
        model=model,
        dtype="float32",
        kernel_backend="torch",
        block_size=4,
        enable_prefix_caching=True,
        speculative_method="ngram",
        num_speculative_tokens=5,
    )
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()["speculative"]
    assert st["proposed_tokens"] > st["accepted_tokens"] > 0
    valid = set()
    for p, o in zip(prompts, outs):
        text = p + o.outputs[0].token_ids
        valid.update(SeqBlockHashes(extra_key(None, None)).upto(text, len(text) // 4, 4))
    cached = set(llm.engine.kv.pool.cached)
    assert cached and cached <= valid, "a registered block holds tokens no sequence ended up with"
    _assert_conserved(llm)


def test_speculative_config_is_validated(setup, tmp_path):
    model, _, _ = setup
    with pytest.raises(ValueError, match="draft_model"):
        EngineConfig(model=model, speculative_method="draft")
    with pytest.raises(ValueError, match="speculative_method"):
        EngineConfig(model=model, speculative_method="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(model=model, speculative_method="ngram", num_speculative_tokens=0)
    other = create_random_checkpoint(tmp_path / "big_vocab", preset="demo", vocab_size=2048)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(model=model, speculative_method="draft", draft_model=str(other))


def test_sampler_processing_applies_to_verification(setup):
    """logit_bias changes the argmax: verification must judge drafts by the processed logits, as the
    sampler does. Penalties depend on each row's own history: each verified position is judged
    with the drafts before it in that history, so those requests speculate and still decode exactly."""
    model, _, _ = setup
    prompts = _prompts(6, seed=8)
    bias = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logit_bias={42: 1.5, 7: 0.8})
    _, plain = _run(model, {}, prompts, bias, dtype="float32", kernel_backend="torch")
    llm, spec = _run(
        model,
        {},
        prompts,
        bias,
        dtype="float32",
        kernel_backend="torch",
        speculative_method="ngram",
        num_speculative_tokens=4,
    )
    assert spec == plain and llm.engine.stats()["speculative"]["proposed_tokens"] > 0
    assert any(42 in o or 7 in o for o in plain), "the bias was meant to matter"
    pen = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, presence_penalty=0.5)
    _, plain_pen = _run(model, {}, prompts, pen, dtype="float32", kernel_backend="torch")
    llm, spec_pen = _run(model, {}, prompts, pen, dtype="float32", kernel_backend="torch", speculative_method="ngram")
    assert spec_pen == plain_pen and llm.engine.stats()["speculative"]["proposed_tokens"] > 0
