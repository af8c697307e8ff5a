"""The demo model's tool-aware chat template, and when the server uses it.

SmolLM2-135M-Instruct's own template ignores ``tools``. This one renders EXACTLY what the original
renders for a conversation without tools (so the base model, the french and pirate adapters and
every prompt cache see the same tokens), and with tools it lists them in the system prompt, renders
an assistant's calls as Hermes ``<tool_call>`` blocks and a tool's result as a ``<tool_response>``
user turn. The ``tools`` demo adapter is trained on prompts rendered by this very template
(platform/demo/train.py), and the server's default tool-call parser (hermes) reads what it writes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# What the system prompt gains when tools are offered (kept short: every token is a training
# token of the tools adapter and a prompt token of every request).
_TOOLS_BLOCK = (
    "{{- '\\n\\nYou can call these tools:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}"
    "{{- '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\nTo call a tool, answer with <tool_call>\\n"
    '{"name": <tool name>, "arguments": <JSON object>}'
    "\\n</tool_call>' -}}"
    "{%- if response_schema is defined and response_schema -%}"
    "{{- '\\nYour final answer (no tool call) is JSON with this schema:\\n' + (response_schema | tojson) -}}"
    "{%- endif -%}"
)

DEMO_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "' -}}"
    "{%- if tools -%}" + _TOOLS_BLOCK + "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + message['content'] -}}"
    "{%- if loop.first and tools -%}" + _TOOLS_BLOCK + "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{{- '<tool_call>\\n' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']}"
    " | tojson) + '\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def tool_call_text(name: str, arguments: dict) -> str:
    """An assistant's call exactly as the template renders it (and the adapter learns to write it)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


@lru_cache(maxsize=8)
def is_demo_model(model_dir: Path | None) -> bool:
    """The checkpoint ``loraplex`` converted from the embedded demo model (its marker names it)."""
    from loraplex.engine import DEMO_MODEL_NAME

    if model_dir is None:
        return False
    try:
        info = json.loads((Path(model_dir) / "loraplex-converted.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("name") == DEMO_MODEL_NAME


def default_template(configured: str | None, model_dir: Path | None) -> str | None:
    """The server's template: the operator's (``[openai] chat_template``), else this one when
    serving the demo model, else None (the tokenizer's own)."""
    if configured:
        return configured
    return DEMO_CHAT_TEMPLATE if is_demo_model(model_dir) else None
