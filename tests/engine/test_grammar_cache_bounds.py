"""The grammar cache is bounded by bytes (xgrammar's memory_size_bytes of each compiled grammar),
not only by count, and a spec over the size limit is refused naming response_format before any
compilation."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from loraplex.engine import InvalidRequestError
from loraplex.engine.sampling_params import StructuredOutputSpec
from loraplex.engine.structured_output import StructuredOutputManager


def _enum(i: int, k: int = 300) -> StructuredOutputSpec:
    return StructuredOutputSpec.json_schema(
        {"type": "object", "properties": {"v": {"enum": [f"v{i}_{j}" for j in range(k)]}}}
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def test_cache_stays_under_its_byte_bound(tokenizer):
    probe = StructuredOutputManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id or 0])
    one = int(probe.compile(_enum(0)).memory_size_bytes)
    assert one > 0
    mgr = StructuredOutputManager(
        tokenizer, len(tokenizer), [tokenizer.eos_token_id or 0], cache_max_bytes=int(one * 3.5)
    )
    for i in range(10):
        mgr.compile(_enum(i))
        assert mgr._cache_bytes <= max(int(one * 3.5), one * 1.5)
    assert len(mgr._cache) <= 4 and mgr.is_compiled(_enum(9)) and not mgr.is_compiled(_enum(0))
    assert mgr._cache_bytes == sum(mgr._sizes.values())


def test_a_spec_over_the_size_limit_is_refused_naming_it(tokenizer):
    mgr = StructuredOutputManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id or 0], max_spec_bytes=10_000)
    big = _enum(0, k=2000)
    assert len(big.value) > 10_000 and json.loads(big.value)
    with pytest.raises(InvalidRequestError) as err:
        mgr.compile(big)
    assert err.value.param == "response_format" and "limit" in str(err.value)
    assert not mgr._cache
