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
    def logits(self, tokens: list[int], adapter: str | None) -> torch.Tensor:
        """The logits of every position of ``tokens`` under ``adapter`` (None: the base), float32."""
        ids = torch.tensor([tokens])
        if adapter is None:
            with self.model.disable_adapter():
                return self.model(ids).logits[0].float()
        self.model.set_adapter(adapter)
        return self.model(ids).logits[0].float()

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


# One batch mixing adapters of different ranks and targets, repeats, and a request without one.
MIXED_ASSIGN = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", "attn_r8", "mlp_r4"]


def assert_mixed_batch_matches_peft(llm, oracle: PeftOracle, tie: float, max_new: int = 8) -> None:
    """One engine batch over MIXED_ASSIGN: every token the engine picks is PEFT's greedy choice on
    the same prefix up to a near-tie of ``tie`` logits, all but two requests equal PEFT's greedy
    output, and the adapters matter (at least three change the base model's output, or the
    comparison proves nothing; at least four adapters shared a step)."""
    from loraplex.engine import SamplingParams

    prompts = make_prompts(len(MIXED_ASSIGN), llm.engine.model_config.vocab_size, seed=2)
    params = SamplingParams(max_tokens=max_new, min_tokens=max_new, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, adapters=MIXED_ASSIGN)
    identical, changed = 0, set()
    for i, (prompt, adapter, out) in enumerate(zip(prompts, MIXED_ASSIGN, outs)):
        assert len(out.token_ids) == max_new and out.adapter == adapter
        logits = oracle.logits(prompt + out.token_ids[:-1], adapter)[len(prompt) - 1 :]
        best = logits.max(dim=-1).values
        picked = logits.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        gap = (best - picked).max().item()
        assert gap <= tie, f"request {i} (adapter {adapter}): a token {gap:.4f} below PEFT's greedy choice"
        expected = oracle.greedy(prompt, adapter, max_new)
        identical += out.token_ids == expected
        if adapter is not None and expected != oracle.greedy(prompt, None, max_new):
            changed.add(adapter)
    assert identical >= len(MIXED_ASSIGN) - 2, (
        f"only {identical}/{len(MIXED_ASSIGN)} requests equal PEFT's greedy output"
    )
    assert len(changed) >= 3, f"only {changed} changed the base model's output"
    assert llm.engine.stats()["lora"]["max_adapters_per_step"] >= 4
