"""Mixed-adapter batches must reproduce peft.PeftModel token for token (greedy), per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lora_testlib import PeftOracle, make_adapters, make_prompts

from loraplex.engine import LLM, SamplingParams

pytestmark = pytest.mark.slow  # subprocesses and the Triton interpreter

ASSIGN = [
    "attn_r8",
    "mlp_r4",
    None,
    "all_r16_rslora",
    "qv_down_patterns",
    "layer1_q_up",
    None,
    "attn_r8",
    "all_r16_rslora",
    "mlp_r4",
    "qv_down_patterns",
    "layer1_q_up",
]


@pytest.fixture(scope="module", params=["llama_gqa", "qwen2_bias"])
def setup(request, model_factory, tmp_path_factory):
    model_dir = model_factory(request.param)
    adapters = make_adapters(model_dir, tmp_path_factory.mktemp(f"adapters_{request.param}"))
    return model_dir, adapters, PeftOracle(model_dir, adapters)


def test_one_generate_mixing_adapters_matches_peft(setup):
    model_dir, adapters, oracle = setup
    max_new = 10
    # A 32-token budget chunks the longer prompts, so prefill chunks and decodes of different
    # adapters share steps.
    llm = LLM(
        model=model_dir,
        dtype="float32",
        kernel_backend="torch",
        max_num_seqs=8,
        max_num_batched_tokens=32,
        block_size=4,
        max_loras=8,
        max_cpu_loras=8,
        max_lora_rank=16,
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    prompts = make_prompts(len(ASSIGN), llm.engine.model_config.vocab_size, seed=1)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0, ignore_eos=True), adapters=ASSIGN)
    changed = set()
    for i, (prompt, adapter, out) in enumerate(zip(prompts, ASSIGN, outs)):
        expected = oracle.greedy(prompt, adapter, max_new)
        assert out.token_ids == expected, f"request {i} (adapter {adapter}, prompt len {len(prompt)}) diverged"
        assert out.adapter == adapter
        if adapter is not None and expected != oracle.greedy(prompt, None, max_new):
            changed.add(adapter)
    # The adapters must actually matter, or the comparison proves nothing.
    assert len(changed) >= 4, f"only {changed} changed the base model's output"
    stats = llm.engine.stats()["lora"]
    assert 4 <= stats["max_adapters_per_step"] <= 8
    assert stats["active_requests"] == {}
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


_TRITON_SCRIPT = """
import json, sys
from loraplex.engine import LLM, SamplingParams
cfg = json.loads(sys.argv[1])
llm = LLM(model=cfg["model"], dtype="float32", kernel_backend="triton", max_num_seqs=8,
          max_num_batched_tokens=24, block_size=4, max_loras=4, max_cpu_loras=4, max_lora_rank=16)
for name, path in cfg["adapters"].items():
    llm.add_adapter(name, path)
outs = llm.generate(cfg["prompts"], SamplingParams(max_tokens=cfg["max_new"], temperature=0.0, ignore_eos=True),
                    adapters=cfg["assign"])
print("RESULT " + json.dumps({"tokens": [o.token_ids for o in outs], "ops": llm.engine.runner.ops.name,
                              "max_adapters": llm.engine.stats()["lora"]["max_adapters_per_step"]}))
"""


def test_triton_backend_under_interpreter_matches_peft(model_factory, tmp_path_factory):
    """The whole engine path through the Triton kernels (SGMV + paged attention) on CPU tensors.

    Runs in a subprocess so TRITON_INTERPRET=1 is set before triton is first imported, whatever
    this pytest process imported already."""
    pytest.importorskip("triton")
    model_dir = model_factory("llama_gqa")
    specs = ["attn_r8", "mlp_r4", "all_r16_rslora", "qv_down_patterns"]
    from lora_testlib import ADAPTER_SPECS

    adapters = make_adapters(
        model_dir, tmp_path_factory.mktemp("adapters_triton"), {k: ADAPTER_SPECS[k] for k in specs}
    )
    assign = ["attn_r8", None, "mlp_r4", "all_r16_rslora", "qv_down_patterns", "attn_r8"]
    max_new = 5
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = make_prompts(len(assign), vocab, seed=2, lengths=(3, 30, 1, 9, 14, 5))
    cfg = dict(model=model_dir, adapters=adapters, prompts=prompts, assign=assign, max_new=max_new)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(Path(__file__).parent),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["ops"] == "triton"
    assert result["max_adapters"] == 4
    oracle = PeftOracle(model_dir, adapters)
    for i, (prompt, adapter, got) in enumerate(zip(prompts, assign, result["tokens"])):
        assert got == oracle.greedy(prompt, adapter, max_new), f"request {i} (adapter {adapter}) diverged"
