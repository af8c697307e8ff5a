"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeded generators."""
from __future__ import annotations

import torch

from .sampling_params import SamplingParams
from .sequence import Sequence


def sampling_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request samples from: temperature, then top-k, then top-p.
    Speculative decoding's rejection rule needs these same probabilities."""
    row = row / p.temperature
    if p.top_k > 0 and p.top_k < row.shape[-1]:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass BEFORE it already reaches top_p (the top token always stays).
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= p.top_p
        row = row.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return torch.softmax(row, dim=-1)


def sample(logits: torch.Tensor, seqs: list[Sequence], default_generator: torch.Generator) -> list[int]:
    """logits: float32 [len(seqs), vocab]. Returns one token id per sequence."""
    if not seqs:
        return []
    tokens = logits.argmax(dim=-1).tolist()  # greedy answer for every row; others overwrite
    for i, seq in enumerate(seqs):
        p = seq.request.params
        if p.greedy:
            continue
        probs = sampling_probs(logits[i], p)
        gen = seq.generator or default_generator
        tokens[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens
