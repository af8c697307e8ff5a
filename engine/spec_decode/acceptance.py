"""Verifying proposals against the target model's logits.

Greedy: accept draft tokens while they equal the target's argmax; the first mismatch is replaced by
the target's own token (and when all match, the target's next token is a free bonus). The output is
exactly what plain greedy decoding produces, token for token.

Sampling (temperature > 0): the standard speculative-sampling rule (Leviathan et al. 2023; Chen et
al. 2023). Draft token x, drawn from the draft's distribution q, is kept with probability
min(1, p(x) / q(x)); on rejection the replacement is drawn from norm(max(0, p - q)); if all k are
kept, one more token comes from p at position k+1. Every emitted token is then distributed exactly
as the target's p. A proposer without a distribution (n-gram) is a point mass q = 1{x}: x is kept
with probability p(x), a replacement comes from p with x removed. All draws use the request's
generator, so seeded requests are reproducible.
"""

from __future__ import annotations

import torch


def verify_greedy(draft: list[int], target_argmax: list[int]) -> list[int]:
    """``target_argmax[i]`` is the target's token after the first i draft tokens (len(draft) + 1
    entries). Returns the accepted draft prefix plus the target's correction or bonus token."""
    out: list[int] = []
    for i, token in enumerate(draft):
        if target_argmax[i] != token:
            break
        out.append(token)
    out.append(target_argmax[len(out)])
    return out


def verify_sampled(
    draft: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor, generator: torch.Generator
) -> list[int]:
    """``target_probs`` [len(draft) + 1, V]: p at each position; ``draft_probs`` [len(draft), V]
    (q the draft sampled from) or None for a point-mass proposer."""
    out: list[int] = []
    dev = target_probs.device
    for i, x in enumerate(draft):
        p = target_probs[i]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand((), generator=generator, device=dev))
        if u * q_x < float(p[x]):  # u < p(x)/q(x), without dividing by a tiny q
            out.append(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: rejection had probability ~0
            residual = p
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)))
    return out
