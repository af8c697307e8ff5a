"""Load a tokenizer from a local directory only (never the hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"tokenizer directory {path} does not exist")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
