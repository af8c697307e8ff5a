"""Helpers for the multi-LoRA tests: real PEFT adapters on tiny models, and the PEFT oracle."""

from __future__ import annotations

import random
from pathlib import Path

import torch

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]

# name -> LoraConfig kwargs: different ranks, targets, rsLoRA, per-module rank/alpha, layer subsets.
ADAPTER_SPECS = {
    "attn_r8": dict(r=8, lora_alpha=16, target_modules=ATTN),
    "mlp_r4": dict(r=4, lora_alpha=8, target_modules=MLP),
    "all_r16_rslora": dict(r=16, lora_alpha=8, target_modules=ATTN + MLP, use_rslora=True),
    "qv_down_patterns": dict(
        r=2,
        lora_alpha=4,
        target_modules=["v_proj", "q_proj", "down_proj"],
        rank_pattern={"down_proj": 6},
        alpha_pattern={"q_proj": 12},
    ),
    "layer1_q_up": dict(r=8, lora_alpha=32, target_modules=["q_proj", "up_proj"], layers_to_transform=[1]),
}


def make_peft_adapter(base_dir: str, out_dir: str | Path, seed: int = 0, **lora_kwargs) -> str:
    """Save a PEFT LoRA adapter with random, non-zero A and B (init_lora_weights=False)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(init_lora_weights=False, lora_dropout=0.0, **lora_kwargs)
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(str(out_dir))
    return str(out_dir)


def make_adapters(base_dir: str, root: Path, specs: dict[str, dict] = ADAPTER_SPECS) -> dict[str, str]:
    return {
        name: make_peft_adapter(base_dir, root / name, seed=i + 1, **kw) for i, (name, kw) in enumerate(specs.items())
    }


class PeftOracle:
    """One HF model with every adapter loaded; greedy generation with a chosen adapter (or none)."""

    def __init__(self, base_dir: str, adapters: dict[str, str]):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        names = list(adapters)
        self.model = PeftModel.from_pretrained(base, adapters[names[0]], adapter_name=names[0]).eval()
        for name in names[1:]:
            self.model.load_adapter(adapters[name], adapter_name=name)
        self.model.eval()

    @torch.inference_mode()
    def logprobs(self, prompt: list[int], tokens: list[int], adapter: str | None) -> torch.Tensor:
        """log p(tokens[i] | prompt + tokens[:i]) under ``adapter`` (teacher-forced), float32."""
        ids = torch.tensor([prompt + tokens[:-1]])
        if adapter is None:
            with self.model.disable_adapter():
                logits = self.model(input_ids=ids).logits[0]
        else:
            self.model.set_adapter(adapter)
            logits = self.model(input_ids=ids).logits[0]
        lp = torch.log_softmax(logits[len(prompt) - 1 :].float(), dim=-1)
        return lp.gather(1, torch.tensor(tokens)[:, None])[:, 0]

    @torch.inference_mode()
    def greedy(self, prompt: list[int], adapter: str | None, max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        kwargs = dict(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
        )
        if adapter is None:
            with self.model.disable_adapter():
                out = self.model.generate(**kwargs)
        else:
            self.model.set_adapter(adapter)
            out = self.model.generate(**kwargs)
        return out[0, len(prompt) :].tolist()


def make_prompts(
    n: int, vocab: int, seed: int = 0, lengths=(3, 17, 5, 26, 1, 9, 40, 12, 7, 21, 2, 33)
) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def make_small_draft(path: Path) -> str:
    """A one-layer random checkpoint sharing the tiny target's tokenizer but not its shapes: the
    draft model of the speculative tests (proposes, is mostly rejected, never changes the output)."""
    from loraplex.engine.demo_model import create_random_checkpoint

    return str(
        create_random_checkpoint(
            path,
            preset="demo",
            seed=11,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            initializer_range=0.1,
        )
    )
