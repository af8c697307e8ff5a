"""Helpers of the demo tests (the real demo model served by `loraplex serve`)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

ADMIN_KEY = "lpx-admin-demo-test-key-0123456789"


def printed_demo_key(log: Path) -> str:
    match = re.search(r"Demo tenant 'demo' created; its API key \(shown once\):\s+(\S+)", log.read_text())
    assert match, log.read_text()
    return match.group(1)


def zip_adapter(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            zf.write(folder / name, name)
    return buf.getvalue()
