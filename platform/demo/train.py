"""Train the demo LoRA adapters with ``peft`` on the CPU, from the built-in dataset.

Prompts go through the demo model's chat template (platform/demo/chat_template.py: the model's own
for a conversation without tools, the tools listed in the system prompt otherwise), exactly as the
OpenAI endpoint renders them, so what the adapter learns is what a client sees; the loss is on the
assistant's tokens only (every assistant turn of a conversation: platform/demo/encode.py). LoRA sits on the top ``layers_from_top`` decoder layers. The frozen layers
below see the same inputs at every step, so their output is computed ONCE per example and the
steps run only the top of the network (forward and backward): several times cheaper than full
fine-tuning steps, which is what lets an adapter train in a minute or two on two CPU cores.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loraplex.platform.demo import encode
from loraplex.platform.demo.chat_template import DEMO_CHAT_TEMPLATE
from loraplex.platform.demo.dataset import conversations
from loraplex.platform.demo.encode import _encode, prompt_text, sequences

__all__ = ["RECIPES", "TrainRecipe", "_encode", "prompt_text", "recipe_key", "train_adapter"]

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
    # Steps of linear warm-up before the linear decay (0: decay from the first step).
    warmup_steps: int = 0


# French needs more than style: new words. It gets more steps, more layers and bigger batches
# (loss 0.09 vs 1.4 with the pirate's recipe, whose answers then drift back into English).
RECIPES = {
    "pirate": TrainRecipe(),
    "french": TrainRecipe(steps=40, batch_size=8, learning_rate=2e-3, layers_from_top=10),
    # Whole agent conversations (tools in the system prompt, calls, results, answers: ~250 tokens
    # each): few layers keep a step short; warm-up lets a higher peak rate converge in few steps.
    # 60 steps (3 passes over the 160 conversations), not 30: at 30 the turns after a result that
    # are calls (handoffs, final_result) were not learnt at all (benchmarks/demo/tools_adapter.py).
    "tools": TrainRecipe(steps=60, batch_size=8, learning_rate=4e-3, layers_from_top=4, warmup_steps=3),
}

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CHECKPOINT = "partial-checkpoint.pt"  # mid-training state, removed once the adapter is saved


def recipe_key(model_dir: Path, adapter: str, recipe: TrainRecipe) -> str:
    """Everything that decides an adapter's weights: the base model's files (by size and config),
    the recipe, the data, the chat template and this trainer's source. A done marker or a
    mid-training checkpoint with another key is stale."""
    config = (Path(model_dir) / "config.json").read_text() if (Path(model_dir) / "config.json").is_file() else ""
    weights = sorted((p.name, p.stat().st_size) for p in Path(model_dir).glob("*.safetensors"))
    sources = [Path(__file__).read_text(), Path(encode.__file__).read_text()]
    blob = json.dumps(
        [config, weights, adapter, asdict(recipe), conversations(adapter), DEMO_CHAT_TEMPLATE, sources],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _lr_factor(recipe: TrainRecipe) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / (recipe.warmup_steps + 1)
        return 1.0 - (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)

    return factor


def train_adapter(
    model_dir: Path,
    adapter: str,
    out_dir: Path,
    recipe: TrainRecipe = TrainRecipe(),
    progress: Progress = print,
    key: str | None = None,
    checkpoint_every: int = 5,
) -> Path:
    """Train one demo adapter and save it as a PEFT folder (adapter_config.json + safetensors).

    Every ``checkpoint_every`` steps the LoRA weights, the optimizer and the step go to
    ``out_dir/partial-checkpoint.pt`` (a few MB); a run killed mid-training resumes from there
    when its ``key`` (``recipe_key``) is unchanged. The batches are drawn from the recipe's seed
    up front, so a resumed run sees the same batches as an uninterrupted one."""
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
    examples = [seq for ex in conversations(adapter) for seq in sequences(tokenizer, ex)]
    frozen = _frozen_inputs(model, [ids for ids, _ in examples], first)
    progress(
        f"[loraplex]   {adapter}: {len(examples)} sequences, layers 0-{first - 1} run once "
        f"({time.monotonic() - start:.0f} s)"
    )
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
    named = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    params = list(named.values())
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(recipe))
    batches = _batches([len(ids) for ids, _ in examples], recipe.batch_size, recipe.steps, rng)
    checkpoint = out_dir / CHECKPOINT
    done = _resume(checkpoint, key, named, optimizer, schedule)
    if done:
        progress(f"[loraplex]   {adapter}: resuming at step {done + 1}/{recipe.steps} from {checkpoint}")
    loop_start, loss_value = time.monotonic(), float("nan")
    for step in range(done, len(batches)):
        loss_value = _step(top, examples, frozen, batches[step], optimizer, schedule)
        if key is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < recipe.steps:
            out_dir.mkdir(parents=True, exist_ok=True)
            tmp = checkpoint.with_suffix(".tmp")
            state = {n: p.detach() for n, p in named.items()}
            torch.save({"key": key, "step": step + 1, "lora": state, "optimizer": optimizer.state_dict()}, str(tmp))
            tmp.replace(checkpoint)  # never a half-written checkpoint
        per_step = (time.monotonic() - loop_start) / (step + 1 - done)
        progress(
            f"[loraplex]   {adapter}: step {step + 1}/{recipe.steps} loss {loss_value:.3f} "
            f"({time.monotonic() - start:.0f} s, ETA {per_step * (recipe.steps - step - 1):.0f} s)"
        )
    saved = _save(peft_model, get_peft_model_state_dict, save_file, out_dir, first, num_layers, recipe, model_dir)
    checkpoint.unlink(missing_ok=True)
    return saved


def _step(top, examples, frozen, picked: list[int], optimizer, schedule) -> float:
    import torch

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
    return float(loss.item())


def _resume(checkpoint: Path, key: str | None, named: dict, optimizer, schedule) -> int:
    """Load a mid-training checkpoint of this very key; returns the steps it had done (0: none)."""
    import torch

    if key is None or not checkpoint.is_file():
        return 0
    try:
        state = torch.load(str(checkpoint), weights_only=True)
    except Exception:  # a torn or foreign file: train from the start
        return 0
    if state.get("key") != key or set(state["lora"]) != set(named):
        return 0
    with torch.no_grad():
        for name, tensor in state["lora"].items():
            named[name].copy_(tensor)
    optimizer.load_state_dict(state["optimizer"])
    with warnings.catch_warnings():  # "scheduler stepped before the optimizer": on purpose, to catch up
        warnings.simplefilter("ignore")
        for _ in range(state["step"]):
            schedule.step()
    return int(state["step"])


def _frozen_inputs(model, prompts: list[list[int]], first: int) -> list:
    """The input of layer ``first`` for every example: only layers ``0..first-1`` run (the input of
    the final norm is the output of the last layer that ran), in right-padded batches of similar
    lengths (causal attention: padding at the end changes nothing before it). An example the data
    repeats (to weigh a rare turn more) is run once: repeats cost training steps, not this pass."""
    unique = list(dict.fromkeys(tuple(p) for p in prompts))
    if len(unique) < len(prompts):
        index = {p: k for k, p in enumerate(unique)}
        once = _frozen_inputs(model, [list(p) for p in unique], first)
        return [once[index[tuple(p)]] for p in prompts]
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
