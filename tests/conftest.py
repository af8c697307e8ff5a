"""Shared test helpers. Tiny models are built locally with transformers (never downloaded)."""
from __future__ import annotations

import os

# Make CPU thread use predictable on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
