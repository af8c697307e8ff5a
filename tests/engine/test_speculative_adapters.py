"""Speculation that helps adapter rows, and requests that used to decode plainly.

A draft that is the target (its own directory, or its first layers) shares the target's module and
so its LoRA slots; a copy of the target elsewhere has its slot writes mirrored; a draft of other
shapes serves base rows only and adapter rows fall back to n-gram proposals. Greedy output must
equal plain decoding token for token (PEFT greedy as the independent oracle for adapter rows), and
counters (target steps, acceptance, which proposer served which row) prove speculation happened.
Penalties, token masks, stop strings and grammars speculate too and still decode exactly as plainly.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
from lora_testlib import PeftOracle, make_peft_adapter, make_small_draft

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.sampling_params import StructuredOutputSpec

ADAPTERS = {
    "attn": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "mlp": dict(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"]),
}
BASE = dict(dtype="float32", kernel_backend="torch", max_lora_rank=8, scheduling_policy="fcfs")
GREEDY = SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-lora")
    adapters = {
        n: make_peft_adapter(tiny_llama, root / n, seed=i + 1, **kw) for i, (n, kw) in enumerate(ADAPTERS.items())
    }
    small = make_small_draft(root / "small")
    copy = root / "target-copy"  # the target's weights under another directory: not shared, mirrored
    shutil.copytree(tiny_llama, copy)
    return tiny_llama, adapters, small, str(copy)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 700) for _ in range(rng.randint(3, 24))] for _ in range(n)]


PROMPTS = _prompts(9)
NAMES = [None, "attn", "mlp"]


def _run(model, adapters, params, prompts=PROMPTS, **kw):
    llm = LLM(model=model, **BASE, **kw)
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    outs = llm.generate(prompts, params, adapters=[NAMES[i % 3] for i in range(len(prompts))])
    return llm, [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def plain(setup):
    model, adapters, _, _ = setup
    llm, outs = _run(model, adapters, GREEDY)
    return llm.engine.counters["steps"], [o.token_ids for o in outs]


def _spec(draft: str, k: int = 4, **kw) -> dict:
    return dict(
        speculative_method="draft", draft_model=draft, num_speculative_tokens=k, speculative_adaptive=False, **kw
    )


def test_draft_equal_to_target_applies_each_rows_adapter(setup, plain):
    model, adapters, _, _ = setup
    plain_steps, expected = plain
    llm, outs = _run(model, adapters, GREEDY, **_spec(model))
    assert [o.token_ids for o in outs] == expected
    oracle = PeftOracle(model, adapters)
    for i in (1, 2, 4, 5):  # adapter rows, against PEFT's own greedy decoding
        assert expected[i] == oracle.greedy(PROMPTS[i], NAMES[i % 3], GREEDY.max_tokens), f"prompt {i}"
    st = llm.engine.stats()["speculative"]
    assert st["draft_shares_target"] and st["draft_applies_adapters"]
    assert st["ngram_rows"] == 0 and st["draft_rows"] > 0, "every row, adapter rows too, runs the draft"
    # Base-model drafts for adapter rows accepted ~2/3; with each row's adapter nearly everything.
    assert st["acceptance_rate"] >= 0.95, st
    steps = llm.engine.counters["steps"]
    assert plain_steps >= 2.5 * steps, (plain_steps, steps)


def test_mirrored_draft_applies_adapters_and_self_speculation_stays_exact(setup, plain):
    model, adapters, _, copy = setup
    _, expected = plain
    llm, outs = _run(model, adapters, GREEDY, **_spec(copy))
    assert [o.token_ids for o in outs] == expected
    st = llm.engine.stats()["speculative"]
    assert not st["draft_shares_target"] and st["draft_applies_adapters"]
    assert st["ngram_rows"] == 0 and st["acceptance_rate"] >= 0.95, st
    target_qkv = llm.engine.runner.model.layers[0].self_attn.qkv_proj
    draft_qkv = llm.engine.spec.draft.runner.model.layers[0].self_attn.qkv_proj
    assert draft_qkv is not target_qkv and draft_qkv.lora_a is not None
    assert draft_qkv.lora_a.equal(target_qkv.lora_a) and draft_qkv.lora_ranks.equal(target_qkv.lora_ranks)

    # Self-speculation: the target's first layer as the draft (its norm and head after it).
    llm, outs = _run(model, adapters, GREEDY, **_spec(model, draft_num_layers=1))
    assert [o.token_ids for o in outs] == expected
    st = llm.engine.stats()["speculative"]
    assert st["draft_shares_target"] and st["draft_rows"] > 0 and st["ngram_rows"] == 0
    assert len(llm.engine.spec.draft.runner.kv_caches) == 1


def test_a_draft_that_cannot_apply_adapters_sends_adapter_rows_to_ngram(setup, plain):
    model, adapters, small, _ = setup
    _, expected = plain
    # Repetitive prompts, so the n-gram fallback has something to propose.
    llm, outs = _run(model, adapters, GREEDY, **_spec(small, k=3))
    assert [o.token_ids for o in outs] == expected
    st = llm.engine.stats()["speculative"]
    assert not st["draft_applies_adapters"]
    assert st["draft_rows"] > 0 and st["ngram_rows"] > 0, st
    # The fallback rows are exactly the adapter rows: 6 of 9 sequences, every decode step.
    assert st["ngram_rows"] > st["draft_rows"]


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_penalties_masks_stop_strings_and_grammars_speculate_exactly(setup, method):
    model, adapters, _, _ = setup
    free = LLM(model=model, **BASE).generate(PROMPTS[:1], GREEDY)[0].outputs[0].text
    stop = free[6:8] if len(free) >= 8 else free[-2:]
    assert stop, "the random model was meant to write some text"
    grammar = StructuredOutputSpec.json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"enum": ["x", "yy"]}},
            "required": ["a", "b"],
            "additionalProperties": False,
        }
    )
    kinds = [
        dict(presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.3),
        dict(min_tokens=5, bad_words_token_ids=[[PROMPTS[1][0]], [PROMPTS[2][0], PROMPTS[2][1]]]),
        dict(stop=[stop]),
        dict(structured_output=grammar, ignore_eos=False, max_tokens=40),
    ]
    params = [
        SamplingParams(**{"max_tokens": 21, "temperature": 0.0, "ignore_eos": True, **kinds[i % 4]})
        for i in range(len(PROMPTS))
    ]
    _, want = _run(model, adapters, params)
    spec = _spec(model) if method == "draft" else dict(speculative_method="ngram", num_speculative_tokens=4)
    llm, got = _run(model, adapters, params, **spec)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        ), f"prompt {i} ({list(kinds[i % 4])})"
    assert any(w.stop_reason == stop for w in want), "the stop string was meant to end some output"
    assert any(w.finish_reason == "stop" and "a" in w.text for w in want[3::4]), "the grammar was meant to finish"
    st = llm.engine.stats()["speculative"]
    assert st["proposed_tokens"] > 0 and st["accepted_tokens"] > 0
    if method == "draft":
        assert st["verifications"] >= len(PROMPTS), "every request speculated"


def test_sampled_grammar_rows_and_n2_stop_strings_under_speculation(setup):
    """Sampling with a grammar: every verified position is masked, so the output is valid JSON and
    seeded runs repeat; n = 2 samples with a stop string decode as plain decoding does."""
    model, adapters, _, _ = setup
    # Bounded values: a random model may write an integer's digits until max_tokens.
    schema = {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "yy"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    grammar = SamplingParams(
        max_tokens=40, temperature=0.9, seed=3, structured_output=StructuredOutputSpec.json_schema(schema)
    )
    runs = [_run(model, adapters, grammar, prompts=PROMPTS[:3], **_spec(model)) for _ in range(2)]
    assert [o.token_ids for o in runs[0][1]] == [o.token_ids for o in runs[1][1]]
    for out in runs[0][1]:
        assert out.finish_reason == "stop" and isinstance(json.loads(out.text)["a"], bool), out.text
    assert runs[0][0].engine.stats()["speculative"]["verifications"] > 0

    free = LLM(model=model, **BASE).generate(PROMPTS[3:4], GREEDY)[0].outputs[0].text
    stop = free[4:6] if len(free) >= 6 else free[-1:]
    n2 = SamplingParams(n=2, max_tokens=21, temperature=0.0, ignore_eos=True, stop=[stop])
    want = LLM(model=model, **BASE).generate(PROMPTS[3:6], n2)
    got = LLM(model=model, **BASE, **_spec(model)).generate(PROMPTS[3:6], n2)
    for w, g in zip(want, got):
        assert [(o.token_ids, o.text, o.finish_reason) for o in g.outputs] == [
            (o.token_ids, o.text, o.finish_reason) for o in w.outputs
        ]
