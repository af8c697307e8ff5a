"""Bad adapters are refused with a message naming what is wrong, and the engine keeps serving."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from lora_testlib import ATTN, MLP, make_peft_adapter
from safetensors.torch import load_file, save_file

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.errors import InvalidRequestError
from loraplex.engine.lora import AdapterValidationError, validate_adapter_dir
from loraplex.engine.models import ModelConfig


class _Boom:
    """Unpickling this writes a marker file: proof that a pickle was (not) opened."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).write_text, ("unpickled!",))


@pytest.fixture(scope="module")
def base(model_factory) -> str:
    return model_factory("llama_gqa")


@pytest.fixture(scope="module")
def good(base, tmp_path_factory) -> str:
    return make_peft_adapter(
        base, tmp_path_factory.mktemp("good") / "a", seed=3, r=8, lora_alpha=16, target_modules=ATTN + MLP
    )


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def _edit_weights(path: Path, fn) -> None:
    f = path / "adapter_model.safetensors"
    tensors = load_file(str(f))
    fn(tensors)
    save_file(tensors, str(f))


def test_good_adapter_info(base, good):
    info = validate_adapter_dir(good, base, 64)
    assert info.rank == 8 and info.alpha == 16 and not info.use_rslora
    assert set(info.target_modules) == set(ATTN + MLP)
    assert info.base_model_name_or_path == base
    assert len(info.sha256) == 64
    # a ModelConfig works as well as a directory
    assert validate_adapter_dir(good, ModelConfig.from_dir(base), 64).sha256 == info.sha256
    assert issubclass(AdapterValidationError, InvalidRequestError)


def _case_pickle(p: Path, tmp: Path):
    marker = tmp / "marker"
    (p / "adapter_model.bin").write_bytes(pickle.dumps(_Boom(str(marker))))
    (p / "adapter_model.safetensors").unlink()
    return marker


BAD_CASES = {
    # name: (mutate(path, tmp) -> None, expected substring of the message, max_lora_rank)
    "pickle_only": (_case_pickle, "pickled weights", 64),
    "pickle_next_to_safetensors": (lambda p, t: (p / "extra.pt").write_bytes(b"\x80\x04junk"), "never unpickles", 64),
    "missing_config": (lambda p, t: (p / "adapter_config.json").unlink(), "no adapter_config.json", 64),
    "missing_weights": (lambda p, t: (p / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors", 64),
    "bad_json": (lambda p, t: (p / "adapter_config.json").write_text("{not json"), "not valid JSON", 64),
    "corrupt_safetensors": (
        lambda p, t: (p / "adapter_model.safetensors").write_bytes(b"\x10\x00garbage"),
        "not a readable safetensors",
        64,
    ),
    "rank_too_high": (lambda p, t: None, "exceeds this server's max_lora_rank=4", 4),
    "not_lora": (lambda p, t: _edit_config(p, peft_type="IA3"), "unsupported PEFT type 'IA3'", 64),
    "dora": (lambda p, t: _edit_config(p, use_dora=True), "DoRA", 64),
    "other_architecture": (
        lambda p, t: _edit_config(p, auto_mapping={"base_model_class": "MistralForCausalLM"}),
        "trained for MistralForCausalLM but the base model is LlamaForCausalLM",
        64,
    ),
    "seq_cls": (lambda p, t: _edit_config(p, task_type="SEQ_CLS"), "task_type 'SEQ_CLS'", 64),
    "bias": (lambda p, t: _edit_config(p, bias="all"), "bias='all'", 64),
    "modules_to_save": (lambda p, t: _edit_config(p, modules_to_save=["lm_head"]), "modules_to_save", 64),
    "target_lm_head": (
        lambda p, t: _edit_config(p, target_modules=["q_proj", "lm_head"]),
        "unsupported target module(s) ['lm_head']",
        64,
    ),
    "nan": (
        lambda p, t: _edit_weights(p, lambda w: w[next(iter(w))].view(-1).__setitem__(3, float("nan"))),
        "NaN or infinite",
        64,
    ),
    "inf": (
        lambda p, t: _edit_weights(p, lambda w: w[sorted(w)[-1]].view(-1).__setitem__(0, float("inf"))),
        "NaN or infinite",
        64,
    ),
    "wrong_shape": (
        lambda p, t: _edit_weights(
            p,
            lambda w: w.__setitem__(
                "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight", torch.ones(64, 8)
            ),
        ),
        "layer 0 k_proj: lora_B shape (64, 8) does not match the base model",
        64,
    ),
    "layer_out_of_range": (
        lambda p, t: _edit_weights(
            p,
            lambda w: w.update(
                {k.replace("layers.1.", "layers.7."): w.pop(k) for k in [k for k in w if "layers.1." in k]}
            ),
        ),
        "targets layer 7 but the base model has 2 layers",
        64,
    ),
    "embedding_lora": (
        lambda p, t: _edit_weights(
            p, lambda w: w.__setitem__("base_model.model.model.embed_tokens.lora_embedding_A", torch.ones(8, 4))
        ),
        "token embedding",
        64,
    ),
    "missing_B": (
        lambda p, t: _edit_weights(p, lambda w: w.pop("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight")),
        "up_proj: lora_A has no matching lora_B",
        64,
    ),
    "int_dtype": (
        lambda p, t: _edit_weights(
            p,
            lambda w: w.__setitem__(
                "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", torch.ones(8, 64, dtype=torch.int32)
            ),
        ),
        "dtype torch.int32",
        64,
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_adapter_refused(case, base, good, tmp_path):
    mutate, expected, max_rank = BAD_CASES[case]
    path = _copy(good, tmp_path / "adapter")
    marker = mutate(path, tmp_path)
    with pytest.raises(AdapterValidationError) as err:
        validate_adapter_dir(path, base, max_rank)
    assert expected in str(err.value), str(err.value)
    if isinstance(marker, Path):
        assert not marker.exists(), "a pickle was unpickled"


def test_wrong_base_model_shapes(model_factory, tmp_path):
    """An adapter trained for a model with other k/v widths (MHA vs GQA) is refused."""
    mha = model_factory("llama_mha")
    adapter = make_peft_adapter(mha, tmp_path / "mha_adapter", r=4, lora_alpha=8, target_modules=["k_proj"])
    with pytest.raises(AdapterValidationError, match="k_proj: lora_B shape"):
        validate_adapter_dir(adapter, model_factory("llama_gqa"), 64)


def test_unsupported_module_from_peft(base, tmp_path):
    adapter = make_peft_adapter(base, tmp_path / "head", r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    with pytest.raises(AdapterValidationError, match="lm_head"):
        validate_adapter_dir(adapter, base, 64)


def test_engine_refuses_bad_adapters_and_keeps_serving(base, good, tmp_path):
    llm = LLM(model=base, dtype="float32", kernel_backend="torch", max_loras=2, max_cpu_loras=2, max_lora_rank=8)
    llm.add_adapter("good", good)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    before = llm.generate([[5, 6, 7], [8, 9]], params, adapters=["good", None])
    for case in ("pickle_only", "nan", "wrong_shape", "target_lm_head", "missing_weights", "dora"):
        path = _copy(good, tmp_path / case)
        BAD_CASES[case][0](path, tmp_path)
        with pytest.raises(AdapterValidationError):
            llm.add_adapter(case, str(path))
        with pytest.raises(AdapterValidationError):  # re-adding a known name with bad files
            llm.add_adapter("good", str(path))
    big = make_peft_adapter(base, tmp_path / "big", r=16, lora_alpha=16, target_modules=["q_proj"])
    with pytest.raises(AdapterValidationError, match="max_lora_rank=8"):
        llm.add_adapter("big", big)
    assert llm.engine.lora.list_adapters() == ["good"]
    after = llm.generate([[5, 6, 7], [8, 9]], params, adapters=["good", None])
    assert [o.token_ids for o in after] == [o.token_ids for o in before]


def test_float16_storage_refuses_weights_beyond_its_range(model_factory, tmp_path):
    """Under lora_dtype="float16" a weight > 65504 would become inf: the adapter is refused at
    registration (naming the knob), the engine unchanged; the same adapter serves with "model"."""
    model_dir = model_factory("llama_gqa")
    path = make_peft_adapter(model_dir, tmp_path / "big", seed=3, r=4, target_modules=["q_proj"])
    f = Path(path) / "adapter_model.safetensors"
    tensors = load_file(str(f))
    key = next(k for k in tensors if "lora_B" in k)
    tensors[key][0, 0] = 1e6
    save_file(tensors, str(f))
    common = dict(model=model_dir, dtype="float32", max_num_seqs=2, num_kv_blocks=16, block_size=4, max_lora_rank=8)
    llm = LLM(lora_dtype="float16", **common)
    with pytest.raises(AdapterValidationError, match="lora_dtype"):
        llm.add_adapter("big", path)
    assert llm.engine.lora.list_adapters() == []
    ok = LLM(lora_dtype="model", **common)
    ok.add_adapter("big", path)
    assert ok.engine.lora.list_adapters() == ["big"]
