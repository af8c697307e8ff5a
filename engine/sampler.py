"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeded generators."""
from __future__ import annotations

import torch

from .sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence], default_generator: torch.Generator) -> list[int]:
    """logits: float32 [len(seqs), vocab]. Returns one token id per sequence."""
    if not seqs:
        return []
    tokens = logits.argmax(dim=-1).tolist()  # greedy answer for every row; others overwrite
    for i, seq in enumerate(seqs):
        p = seq.request.params
        if p.greedy:
            continue
        row = logits[i] / p.temperature
        if p.top_k > 0 and p.top_k < row.shape[-1]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop a token once the mass BEFORE it already reaches top_p (the top token always stays).
            drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= p.top_p
            row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        probs = torch.softmax(row, dim=-1)
        gen = seq.generator or default_generator
        tokens[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens
