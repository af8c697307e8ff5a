"""Patterns from adapters (``target_modules``, ``rank_pattern`` / ``alpha_pattern`` keys) are
matched by RE2 in linear time (issue 32 item 5): the same answers as PEFT's ``re`` matching on
ordinary patterns, a catastrophic pattern is answered at once (pytest-timeout is the bound), and
what RE2 cannot match in linear time (backreferences, lookaround) is refused naming the pattern."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lora_testlib import ATTN, MLP, make_peft_adapter

from loraplex.engine.lora import AdapterValidationError, validate_adapter_dir
from loraplex.engine.lora.patterns import MAX_PATTERN_CHARS, PatternError, fullmatch, suffix_match

MODULES = [
    f"model.layers.{i}.{p}.{m}" for i in (0, 1, 12) for p, ms in (("self_attn", ATTN), ("mlp", MLP)) for m in ms
] + ["lm_head", "model.embed_tokens", "model.norm"]

# The shapes users write in PEFT configs (peft docs and hub adapters), and some composed ones.
ATOMS = [
    "q_proj",
    "v_proj",
    r".*\.q_proj",
    r".*(q|k|v)_proj",
    r"model\.layers\.\d+\.self_attn\.(q_proj|v_proj)",
    r".*\.(gate|up|down)_proj$",
    r"^model\.layers\.1\..*",
    r".*layers\.(0|1)\.mlp.*",
    r"[a-z_.0-9]+",
    r"(?:.*\.)?o_proj",
    r"model.*norm",
    r".*\.(self_attn|mlp)\.[a-z]+_proj",
]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(ATOMS), min_size=1, max_size=3),
    joiner=st.sampled_from(["|", ""]),
    name=st.sampled_from(MODULES),
)
def test_re2_answers_as_pythons_re_on_ordinary_patterns(parts, joiner, name):
    pattern = joiner.join(f"(?:{p})" for p in parts)
    assert fullmatch(pattern, name) == (re.fullmatch(pattern, name) is not None)  # PEFT target_modules
    assert suffix_match(pattern, name) == (re.match(rf"(.*\.)?({pattern})$", name) is not None)  # rank_pattern


CATASTROPHIC = r"(([a-z_.0-9])+)+X"  # Python's re: ~3.5 s at 22 characters, doubling per character


@pytest.mark.timeout(60)
def test_a_catastrophic_pattern_is_answered_at_once():
    for name in MODULES:
        assert not fullmatch(CATASTROPHIC, name + name)
        assert not suffix_match(CATASTROPHIC, name)


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=q)q_proj", r"(?<!x)q_proj", "x" * (MAX_PATTERN_CHARS + 1)])
def test_what_re2_cannot_do_in_linear_time_is_refused(pattern):
    with pytest.raises(PatternError):
        fullmatch(pattern, "q_proj")


@pytest.fixture(scope="module")
def adapter(model_factory, tmp_path_factory) -> tuple[str, str]:
    base = model_factory("llama_gqa")
    path = make_peft_adapter(base, tmp_path_factory.mktemp("pat") / "a", seed=3, r=4, lora_alpha=8, target_modules=ATTN)
    return base, path


def _with_config(src: str, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.timeout(120)
def test_an_adapter_with_a_catastrophic_target_modules_is_validated_at_once(adapter, tmp_path):
    base, src = adapter
    # Nested quantifiers that never match: PEFT would apply it to nothing; we only check it, at once.
    info = validate_adapter_dir(_with_config(src, tmp_path / "t", target_modules=CATASTROPHIC), base, 64)
    assert set(info.target_modules) == set(ATTN)  # the weights decide what is served


@pytest.mark.timeout(120)
def test_an_adapter_with_catastrophic_rank_patterns_is_validated_at_once(adapter, tmp_path):
    base, src = adapter
    keys = {CATASTROPHIC: 4, r"(\w+\.?)+\.Y": 4}
    info = validate_adapter_dir(_with_config(src, tmp_path / "r", rank_pattern=keys, alpha_pattern=keys), base, 64)
    assert info.rank == 4


def test_rank_pattern_semantics_stay_pepts(adapter, tmp_path):
    """A key matching the end of the module name after a dot applies; the same key as a mere
    substring elsewhere does not (PEFT's get_pattern_key)."""
    base, src = adapter
    wrong = _with_config(src, tmp_path / "w", rank_pattern={r"q_proj": 2})  # q_proj weights are rank 4
    with pytest.raises(AdapterValidationError, match="q_proj"):
        validate_adapter_dir(wrong, base, 64)
    fine = _with_config(src, tmp_path / "f", rank_pattern={r"q_pro": 2})  # not at a dot boundary: unused
    assert validate_adapter_dir(fine, base, 64).rank == 4


def test_a_backreference_in_an_adapter_pattern_is_refused_naming_it(adapter, tmp_path):
    base, src = adapter
    bad = _with_config(src, tmp_path / "b", target_modules=r"(q)\1_proj")
    with pytest.raises(AdapterValidationError, match="target_modules"):
        validate_adapter_dir(bad, base, 64)
    bad2 = _with_config(src, tmp_path / "b2", rank_pattern={"(?=q)q_proj": 4})
    with pytest.raises(AdapterValidationError, match="rank_pattern"):
        validate_adapter_dir(bad2, base, 64)
