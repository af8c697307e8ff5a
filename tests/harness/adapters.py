"""Real PEFT adapters for tests and benchmarks (made with peft on a local checkpoint, nothing
downloaded), their files, and the zip an upload sends."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path


def make_peft_adapter(
    base_dir: Path, out_dir: Path, *, r: int = 4, alpha: int = 8, targets=("q_proj", "v_proj"), seed: int = 0
) -> Path:
    """A real PEFT adapter with non-zero weights, saved as safetensors."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    cfg = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def adapter_files(adapter_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(adapter_dir.iterdir()) if p.is_file()}


def zip_bytes(
    files: dict[str, bytes], *, symlinks: dict[str, str] | None = None, compression=zipfile.ZIP_DEFLATED
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()
