"""HTTP pieces the hostile server tests share (test_hostile_prompt_kernels.py,
test_hostile_prompt_chunks.py, test_hostile_pair_panels.py): one request with its whole answer, the JSON payloads of an answer
or a stream, every logprob number in a payload."""

from __future__ import annotations

import json

import httpx
from billing_helpers import auth


def fire(url: str, key: str, path: str, body: dict) -> tuple[int, str]:
    """POST ``body`` (streamed when it asks to be); the status and the whole text. A streamed 200
    must end with ``data: [DONE]``."""
    if body.get("stream"):
        with httpx.stream("POST", url + path, headers=auth(key), json=body, timeout=300) as r:
            text = "\n".join(r.iter_lines())
            if r.status_code == 200:
                assert text.rstrip().endswith("data: [DONE]"), text[-500:]
            return r.status_code, text
    r = httpx.post(url + path, headers=auth(key), json=body, timeout=300)
    return r.status_code, r.text


def payloads(text: str, stream: bool) -> list:
    """The JSON objects of an answer: the body, or every ``data:`` event but [DONE]."""
    if not stream:
        return [json.loads(text)]
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def logprob_numbers(obj, under: bool = False, path: str = "") -> list[tuple[str, float]]:
    """Every number under a key that names logprobs (a NaN comes back as NaN from json.loads)."""
    found: list[tuple[str, float]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += logprob_numbers(v, under or "logprob" in k, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += logprob_numbers(v, under, f"{path}[{i}]")
    elif under and isinstance(obj, float):
        found.append((path, obj))
    return found
