"""Make small deterministic Llama-family checkpoints locally — no hub, no download.

The demo model lets ``loraplex serve`` run on a fresh machine; tests and benchmarks use the same
helpers to build tiny models of every supported architecture. Weights are random (seeded), the
tokenizer is a real byte-level BPE trained on a built-in text, and there is a chat template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PRESETS = {
    # ~3M parameters: tests and the default `serve`.
    "demo": dict(
        hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    # ~24M parameters: benchmarks ("a model of ~20-100M parameters").
    "bench": dict(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
    ),
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Tool-aware in the Hermes format (what the default ``hermes`` tool-call parser reads back); without
# tools and tool calls it renders exactly the plain template.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call these tools. To call one, answer "
    '<tool_call>{"name": <tool name>, "arguments": <arguments object>}</tool_call>\n'
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|end|>\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] or '' }}"
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_CORPUS = """\
loraplex serves one base model and many LoRA adapters to many tenants. Every step of the engine forms
one continuous batch in which sequences of different tenants and different adapters run together.
The scheduler decides who runs next: first come first served, priority classes, or weighted fair
sharing with virtual token counters. The key-value cache is paged: memory is handed out in blocks as a
sequence grows and returned the moment it ends. Adapters are loaded on demand from disk to host memory
to device slots, and a gathered matrix multiply applies each token's own adapter.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828; punctuation: , . ; : ! ? ( ) [ ] { } " ' - _ / @ # $ % & *
Hello, world. How are you today? I am fine, thank you. What is the weather like? It is sunny and warm.
def main():\n    print("hello")\n    return 0\n
"""


def build_tokenizer(vocab_size: int = 1024) -> Any:
    """A byte-level BPE (every byte encodable, so any text round-trips) trained on ``_CORPUS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def create_random_checkpoint(
    out_dir: str | Path,
    arch: str = "llama",
    preset: str = "demo",
    seed: int = 0,
    dtype: str = "float32",
    tie_word_embeddings: bool = False,
    **overrides: Any,
) -> Path:
    """Write config.json, model.safetensors and the tokenizer files of a seeded random model."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab = -(-len(tokenizer) // 64) * 64  # round up like real checkpoints do
    kwargs: dict[str, Any] = dict(PRESETS[preset])
    kwargs.update(
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    kwargs.update(overrides)
    config_cls, model_cls = classes[arch]
    config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def ensure_demo_model(directory: str | Path, preset: str = "demo") -> Path:
    """Create the demo model in ``directory`` unless it is already there; returns its path."""
    directory = Path(directory)
    marker = directory / "loraplex-demo.json"
    if marker.is_file() and json.loads(marker.read_text()).get("preset") == preset:
        return directory
    create_random_checkpoint(directory, arch="llama", preset=preset, seed=1234)
    marker.write_text(json.dumps({"preset": preset, "note": "random weights, generated locally by loraplex"}))
    return directory
