"""Real-text workloads on the real demo model (SmolLM2-135M-Instruct), shared by the benchmarks'
``--real`` modes: chat prompts rendered by the model's own chat template, outputs that end at EOS
(``max_tokens`` only caps them), and the two demo adapters (french, pirate).

The checkpoint is converted once into ``.cache/bench-models/`` (git-ignored) and the adapters are
trained once next to it, with the same code as ``loraplex models pull-demo`` / ``loraplex demo
adapters``.
"""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.lib.paths import BENCH_MODELS
from benchmarks.lib.workload import Arrival

CACHE = BENCH_MODELS

# Everyday questions (not the adapters' training questions): short factual, how-to and open ones.
QUESTIONS = [
    "What is the capital of Germany?",
    "Name a fruit.",
    "What color is the sky?",
    "What is a river?",
    "How do airplanes fly?",
    "Give me three tips for learning a language.",
    "What is photosynthesis?",
    "Write a haiku about autumn.",
    "Why do cats purr?",
    "What is the difference between weather and climate?",
    "Explain what a computer program is.",
    "How many hours are in a day?",
    "What is the speed of light?",
    "Suggest a name for a pet dog.",
    "What causes earthquakes?",
    "Describe a rainbow in two sentences.",
    "What is the largest desert?",
    "How do I boil an egg?",
    "What is democracy?",
    "Why is exercise healthy?",
    "What is an atom?",
    "Tell me a short story about a robot.",
    "What is the capital of Canada?",
    "How does a refrigerator keep food cold?",
    "What are the primary colors?",
    "What is gravity?",
    "Give an example of a mammal that lives in the sea.",
    "What is the Internet?",
    "Who was Albert Einstein?",
    "How do plants drink water?",
    "What is a volcano?",
    "Summarize the plot of Cinderella in one sentence.",
]


def demo_model_dir() -> Path:
    from loraplex.engine.real_model import DEMO_MODEL_NAME, ensure_demo_checkpoint

    return ensure_demo_checkpoint(CACHE / DEMO_MODEL_NAME)


def demo_adapters(model_dir: Path) -> dict[str, str]:
    """name -> PEFT folder of the two demo adapters, trained once (the CLI's recipes)."""
    from loraplex.platform.demo.adapters import train_demo_adapters
    from loraplex.platform.demo.dataset import ADAPTERS

    root = CACHE / "demo-adapters"
    missing = [n for n in ADAPTERS if not (root / n / "adapter_model.safetensors").is_file()]
    if missing:
        train_demo_adapters(model_dir, root, print, names=missing)
    return {n: str(root / n) for n in ADAPTERS}


def chat_prompt(tokenizer, question: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def real_arrivals(
    tokenizer, n: int, times: list[float], max_tokens: int, seed: int, adapters: list[str | None] | None = None
) -> list[Arrival]:
    """``n`` chat requests over QUESTIONS; adapter i % len(adapters) for request i (mixed batches)."""
    rng = random.Random(seed)
    cycle = adapters or [None]
    return [
        Arrival(times[i], chat_prompt(tokenizer, rng.choice(QUESTIONS)), max_tokens, cycle[i % len(cycle)])
        for i in range(n)
    ]
