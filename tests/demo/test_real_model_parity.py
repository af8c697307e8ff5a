"""On the real model, our engine's greedy output equals Hugging Face transformers' (and, with a
demo adapter, peft's) greedy output token for token. Both run in float32 from the same checkpoint."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from loraplex.engine import LLM, SamplingParams

pytestmark = pytest.mark.slow  # the 135M demo model against transformers

QUESTIONS = ["What is the capital of France?", "Write one sentence about the sea.", "What is 3 plus 4?"]
MAX_NEW = 16
EOS = 2  # <|im_end|>: both sides stop there (a real model ends its answers; forcing it on diverges)


def _strip_eos(ids: list[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] == EOS else ids


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                eos_token_id=EOS,
                pad_token_id=EOS,
            )
            outs.append(_strip_eos(gen[0, len(p) :].tolist()))
    return outs


def test_engine_greedy_equals_transformers_and_peft_on_smollm2(smollm2_dir, demo_adapter_dirs):
    from peft import PeftModel

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    llm = LLM(model=str(smollm2_dir), dtype="float32", kernel_backend="torch", max_num_seqs=8, kv_cache_memory_gb=0.1)
    llm.add_adapter("french", str(demo_adapter_dirs["french"]))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    # Base and adapter rows in ONE engine batch.
    outs = llm.generate(prompts + prompts[:2], params, adapters=[None] * len(prompts) + ["french"] * 2)
    ours = [_strip_eos(list(o.token_ids)) for o in outs]
    assert llm.tokenizer.convert_ids_to_tokens(EOS) == "<|im_end|>"

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    assert ours[: len(prompts)] == hf_greedy(hf, prompts)
    with_adapter = PeftModel.from_pretrained(hf, str(demo_adapter_dirs["french"])).eval()
    expected = hf_greedy(with_adapter, prompts[:2])
    assert ours[len(prompts) :] == expected
    assert expected != ours[:2], "the adapter was meant to change the output"
    assert "Paris" in tokenizer.decode(ours[0])
