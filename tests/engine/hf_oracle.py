"""The independent oracle of the engine tests: greedy generation by Hugging Face ``transformers``."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 8, 13, 17, 24, 31, 40, 47, 9, 4, 60][:n]
    return [[rng.randrange(5, vocab) for _ in range(L)] for L in lengths]
