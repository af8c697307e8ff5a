"""Train the demo LoRA adapters with ``peft`` on the CPU, from the built-in dataset.

Prompts go through the demo model's chat template (platform/demo/chat_template.py: the model's own
for a conversation without tools, the tools listed in the system prompt otherwise), exactly as the
OpenAI endpoint renders them, so what the adapter learns is what a client sees; the loss is on the
answer tokens only. LoRA sits on the top ``layers_from_top`` decoder layers. The frozen layers
below see the same inputs at every step, so their output is computed ONCE per example and the
steps run only the top of the network (forward and backward): several times cheaper than full
fine-tuning steps, which is what lets an adapter train in a minute or two on two CPU cores.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.platform.demo.chat_template import DEMO_CHAT_TEMPLATE
from loraplex.platform.demo.dataset import conversations
from loraplex.platform.demo.tool_dataset import Example

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TrainRecipe:
    # 24 steps of 6 = 4.5 passes over the 32 examples: enough for the pirate's style to carry
    # over to unseen questions (tests/demo checks it), short enough for CI.
    steps: int = 24
    batch_size: int = 6
    learning_rate: float = 3e-3
    rank: int = 8
    alpha: float = 16.0
    # LoRA on the top `layers_from_top` decoder layers (all seven projections of each).
    layers_from_top: int = 8
    seed: int = 0


# French needs more than style: new words. It gets more steps, more layers and bigger batches
# (loss 0.09 vs 1.4 with the pirate's recipe, whose answers then drift back into English).
RECIPES = {
    "pirate": TrainRecipe(),
    "french": TrainRecipe(steps=40, batch_size=8, learning_rate=2e-3, layers_from_top=10),
    # Long prompts (the tools in the system prompt, ~180 tokens on average): few layers and steps
    # keep its training short (the CI trains it on every clean clone).
    "tools": TrainRecipe(steps=20, batch_size=8, learning_rate=3e-3, layers_from_top=4),
}

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def prompt_text(tokenizer, example: Example) -> str:
    """The prompt of one example, rendered as the server renders a chat request."""
    messages, tools, _answer = example
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, chat_template=DEMO_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True, **kwargs
    )


def _encode(tokenizer, example: Example) -> tuple[list[int], list[int]]:
    answer = example[2]
    prompt_ids = tokenizer.encode(prompt_text(tokenizer, example), add_special_tokens=False)
    answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def train_adapter(
    model_dir: Path, adapter: str, out_dir: Path, recipe: TrainRecipe = TrainRecipe(), progress: Progress = print
) -> Path:
    """Train one demo adapter and save it as a PEFT folder (adapter_config.json + safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)
    model.eval()  # no dropout anywhere; LoRA dropout is 0 too
    num_layers = model.config.num_hidden_layers
    first = max(0, num_layers - recipe.layers_from_top)
    examples = [_encode(tokenizer, ex) for ex in conversations(adapter)]
    frozen = _frozen_inputs(model, [ids for ids, _ in examples], first)
    # The trainable top: the same model object with only its upper layers (weights shared, not copied).
    model.model.layers = torch.nn.ModuleList(list(model.model.layers)[first:])
    model.config.num_hidden_layers = num_layers - first
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,  # type: ignore[arg-type]  # float alphas are fine
        target_modules=TARGETS,  # (a formatter once folded this line into the comment above)
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    top: Any = peft_model.base_model.model  # LlamaForCausalLM with LoRA layers injected
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / max(1, recipe.steps))
    batches = _batches([len(ids) for ids, _ in examples], recipe.batch_size, recipe.steps, rng)
    for step, picked in enumerate(batches):
        width = max(len(examples[i][0]) for i in picked)
        hidden = torch.zeros(len(picked), width, frozen[0].shape[-1])
        mask = torch.zeros(len(picked), width, dtype=torch.long)
        labels = torch.full((len(picked), width), -100)
        for row, i in enumerate(picked):
            n = len(examples[i][0])
            hidden[row, :n], mask[row, :n] = frozen[i], 1
            labels[row, :n] = torch.tensor(examples[i][1])
        out = top.model(inputs_embeds=hidden, attention_mask=mask, use_cache=False).last_hidden_state
        # Position t predicts token t+1; only answer tokens count (and only they reach lm_head).
        targets = labels[:, 1:]
        keep = targets != -100
        logits = top.lm_head(out[:, :-1][keep])
        loss = torch.nn.functional.cross_entropy(logits, targets[keep])
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == recipe.steps:
            progress(
                f"[loraplex]   {adapter}: step {step + 1}/{recipe.steps} loss {loss.item():.3f} "
                f"({time.monotonic() - start:.0f} s)"
            )
    return _save(peft_model, get_peft_model_state_dict, save_file, out_dir, first, num_layers, recipe, model_dir)


def _frozen_inputs(model, prompts: list[list[int]], first: int) -> list:
    """The input of layer ``first`` for every example: only layers ``0..first-1`` run (the input of
    the final norm is the output of the last layer that ran), in right-padded batches of similar
    lengths (causal attention: padding at the end changes nothing before it)."""
    import torch

    captured: list = []
    hook = model.model.norm.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    num_layers = model.config.num_hidden_layers
    model.config.num_hidden_layers = first  # LlamaModel runs layers[:num_hidden_layers]
    out: list = [None] * len(prompts)
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    try:
        for k in range(0, len(by_length), 8):
            rows = by_length[k : k + 8]
            width = max(len(prompts[i]) for i in rows)
            ids = torch.tensor([prompts[i] + [0] * (width - len(prompts[i])) for i in rows])
            mask = torch.tensor([[1] * len(prompts[i]) + [0] * (width - len(prompts[i])) for i in rows])
            captured.clear()
            with torch.no_grad():
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)
            for row, i in enumerate(rows):
                out[i] = captured[0][row, : len(prompts[i])].clone()
    finally:
        hook.remove()
        model.config.num_hidden_layers = num_layers
    return out


def _batches(lengths: list[int], batch_size: int, steps: int, rng: random.Random) -> list[list[int]]:
    """``steps`` batches: each epoch is shuffled, then every run of four batches is regrouped by
    length, so a batch pads to a width near its own examples' (the tools prompts run from 142 to
    286 tokens: a random batch pads most rows to nearly the longest)."""
    order: list[int] = []
    while len(order) < steps * batch_size:
        order += rng.sample(range(len(lengths)), len(lengths))
    order = order[: steps * batch_size]
    batches = []
    for k in range(0, len(order), 4 * batch_size):
        group = sorted(order[k : k + 4 * batch_size], key=lambda i: lengths[i])
        batches += [group[j : j + batch_size] for j in range(0, len(group), batch_size)]
    rng.shuffle(batches)
    return batches


def _save(
    peft_model,
    state_dict_of,
    save_file,
    out_dir: Path,
    first: int,
    num_layers: int,
    recipe: TrainRecipe,
    model_dir: Path,
) -> Path:
    """Write the PEFT folder with the layer numbers of the full model (the top layers were
    trained as layers 0..k-1 of the truncated one)."""
    import re

    renumbered = {}
    for name, tensor in state_dict_of(peft_model).items():
        name = re.sub(r"\.layers\.(\d+)\.", lambda m: f".layers.{int(m.group(1)) + first}.", name)
        renumbered[name] = tensor.detach().to("cpu").contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(renumbered, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": recipe.rank,
        "lora_alpha": recipe.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": TARGETS,
        "layers_to_transform": list(range(first, num_layers)),
        "use_rslora": False,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out_dir
