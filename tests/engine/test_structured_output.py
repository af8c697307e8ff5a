"""Structured output inside the continuous batch: constrained and free sequences of different
adapters share steps; the grammar forces valid JSON out of a random model; free rows are unaffected
(PEFT greedy is the oracle)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from lora_testlib import PeftOracle, make_peft_adapter

from loraplex.engine import LLM, InvalidRequestError, SamplingParams
from loraplex.engine.sampling_params import StructuredOutputSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "color", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def setup(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("so-adapters")
    adapters = {
        "a1": make_peft_adapter(
            tiny_llama, root / "a1", seed=1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]
        ),
        "a2": make_peft_adapter(
            tiny_llama, root / "a2", seed=2, r=4, lora_alpha=8, target_modules=["o_proj", "up_proj"]
        ),
    }
    llm = LLM(
        model=tiny_llama,
        max_num_seqs=16,
        block_size=8,
        num_kv_blocks=512,
        max_loras=2,
        dtype="float32",
        lora_dtype="model",
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    return llm, adapters


def test_mixed_batch_constrained_and_free_across_adapters(setup, tiny_llama):
    llm, adapters = setup
    spec = StructuredOutputSpec.json_schema(SCHEMA)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14], [20, 21], [30, 31, 32], [40]]
    which = ["a1", None, "a2", "a1", None, "a2"]
    constrained = [True, False, True, False, True, False]
    params = [
        SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured_output=spec)
        if c
        else SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        for i, c in enumerate(constrained)
    ]
    outs = llm.generate(prompts, params, adapters=which)
    oracle = PeftOracle(tiny_llama, adapters)
    for prompt, adapter, c, out in zip(prompts, which, constrained, outs):
        if c:
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)
        else:
            assert out.token_ids == oracle.greedy(prompt, adapter, 10)


def test_json_object_and_n_samples_each_have_their_own_matcher(setup):
    llm, _ = setup
    p = SamplingParams(
        n=3, max_tokens=80, temperature=1.2, seed=5, structured_output=StructuredOutputSpec("json_object")
    )
    out = llm.generate([[3, 4, 5]], p)[0]
    assert len(out.outputs) == 3
    for c in out.outputs:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:  # cut by max_tokens: still a valid JSON prefix that opens an object
            assert c.text.startswith("{")
    assert not llm.engine.structured.active  # matchers are released with their requests


def test_regex_and_unsupported_schema(setup):
    llm, _ = setup
    out = llm.generate(
        [[3, 4]],
        SamplingParams(
            max_tokens=20, temperature=1.0, seed=1, structured_output=StructuredOutputSpec("regex", "(yes|no)!")
        ),
    )[0]
    assert out.text in ("yes!", "no!")
    with pytest.raises(InvalidRequestError, match='Unsupported type "foo"'):
        llm.generate([[3]], SamplingParams(structured_output=StructuredOutputSpec.json_schema({"type": "foo"})))
    assert llm.engine.structured.compile(StructuredOutputSpec.json_schema(SCHEMA)) is llm.engine.structured.compile(
        StructuredOutputSpec.json_schema(dict(reversed(SCHEMA.items())))
    )
