"""Builders for the platform tests: PEFT adapters on tiny local models, archives, attack files."""

from __future__ import annotations

import io
import json
import stat
import tarfile
import zipfile
from pathlib import Path

ADMIN_KEY = "test-admin-key-0123456789abcdef"


def admin_headers(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


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


def targz_bytes(
    files: dict[str, bytes], *, symlinks: dict[str, str] | None = None, hardlinks: dict[str, str] | None = None
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
        for name, target in (hardlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.LNKTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def nan_adapter_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same adapter with a NaN in one LoRA weight."""
    from safetensors.torch import load, save

    tensors = load(files["adapter_model.safetensors"])
    name = sorted(tensors)[0]
    t = tensors[name].clone()
    t.view(-1)[0] = float("nan")
    tensors[name] = t
    return {**files, "adapter_model.safetensors": save(tensors)}


def reshaped_adapter_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same adapter with one lora_B matrix cut to a shape the base model cannot take."""
    from safetensors.torch import load, save

    tensors = load(files["adapter_model.safetensors"])
    name = next(n for n in sorted(tensors) if "lora_B" in n)
    tensors[name] = tensors[name][:-3].contiguous()
    return {**files, "adapter_model.safetensors": save(tensors)}


def with_config(files: dict[str, bytes], **changes) -> dict[str, bytes]:
    cfg = json.loads(files["adapter_config.json"])
    cfg.update(changes)
    return {**files, "adapter_config.json": json.dumps(cfg).encode()}
