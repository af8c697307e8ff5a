"""Batched token sampling: one pass over the whole step's logits, whatever each row asks for.

Per row: an allowed-token bitmask (structured output), logit_bias, presence / frequency /
repetition penalties, then greedy, or temperature -> top-k -> top-p -> min-p -> a draw. Every
stage runs as one tensor operation over the rows that need it (a batch that mixes 64 different
parameter sets costs one pass, not 64); rows that need nothing skip the stage entirely.

Draws use the exponential race (argmax of p / E with E ~ Exp(1)), which samples exactly from p:
rows with a seed fill their own E from their own generator, so a seeded sequence gives the same
tokens whatever else is in the batch; the other rows share one vectorised fill.

Logprobs are the model's own distribution (log-softmax of the raw logits, before penalties, bias,
grammar mask and temperature; vLLM's ``raw_logprobs``), computed only for the rows that ask.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams
from .sequence import Sequence


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens, most likely first


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprobs | None]


@dataclass
class TokenBitmask:
    """Structured-output constraint for some rows: ``bitmask[j]`` (xgrammar's packed int32 layout,
    bit set = allowed) applies to row ``rows[j]`` of the logits."""

    bitmask: torch.Tensor
    rows: list[int]


def sample(logits: torch.Tensor, seqs: Seq[Sequence], default_generator: torch.Generator,
           token_bitmask: TokenBitmask | None = None) -> list[int]:
    return sample_batch(logits, seqs, default_generator, token_bitmask).tokens


def sample_batch(logits: torch.Tensor, seqs: Seq[Sequence], default_generator: torch.Generator,
                 token_bitmask: TokenBitmask | None = None) -> SamplerOutput:
    """logits: [len(seqs), vocab]. Never modifies ``logits`` (forks re-sample from the same rows)."""
    if not seqs:
        return SamplerOutput([], [])
    params = [s.request.params for s in seqs]
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    x = process_logits(logits, seqs, token_bitmask)
    tokens = x.argmax(dim=-1)
    draw_rows = [i for i, p in enumerate(params) if not p.greedy]
    if draw_rows:
        probs = truncated_probs(x[draw_rows], [params[i] for i in draw_rows])
        noise = torch.empty_like(probs).exponential_(generator=default_generator)
        for j, i in enumerate(draw_rows):
            gen = seqs[i].generator
            if gen is not None:
                noise[j].exponential_(generator=gen)
        tokens[draw_rows] = probs.div_(noise).argmax(dim=-1)
    token_list = tokens.tolist()
    logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
    if lp_rows:
        _fill_logprobs(logits, lp_rows, params, token_list, logprobs)
    return SamplerOutput(token_list, logprobs)


def process_logits(logits: torch.Tensor, seqs: Seq[Sequence], token_bitmask: TokenBitmask | None = None) -> torch.Tensor:
    """A float32 copy of ``logits`` with grammar masks, logit_bias and penalties applied."""
    x = logits.float().clone()
    vocab = x.shape[-1]
    if token_bitmask is not None and token_bitmask.rows:
        _apply_bitmask(x, token_bitmask)
    params = [s.request.params for s in seqs]
    bias = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias.items() if t < vocab]
    if bias:
        r, t, b = zip(*bias)
        x.index_put_((torch.tensor(r, device=x.device), torch.tensor(t, device=x.device)),
                     torch.tensor(b, dtype=x.dtype, device=x.device), accumulate=True)
    pen_rows = [i for i, p in enumerate(params) if p.has_penalties]
    if pen_rows:
        x[pen_rows] = _apply_penalties(x[pen_rows], [seqs[i] for i in pen_rows])
    return x


def truncated_probs(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Softmax of x / temperature after top-k, top-p and min-p (rows that disable one skip it)."""
    dev = x.device
    vocab = x.shape[-1]
    x = x / torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_x, order = x.sort(dim=-1, descending=True)
        kth = sorted_x.gather(1, (top_k - 1).unsqueeze(1))
        sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
        sorted_p = sorted_x.softmax(dim=-1)
        # Drop a token once the mass BEFORE it already reaches top_p (the top token always stays).
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p.unsqueeze(1)
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(1, order, sorted_x)
    probs = x.softmax(dim=-1)
    min_p = torch.tensor([p.min_p for p in params], device=dev)
    if bool((min_p > 0).any()):
        floor = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _apply_bitmask(x: torch.Tensor, tb: TokenBitmask) -> None:
    # Unpack the 32 bits of each int32 word: [rows, words] -> [rows, words * 32] booleans.
    shifts = torch.arange(32, device=x.device, dtype=torch.int32)
    bits = (tb.bitmask.to(x.device).unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(bits.shape[0], -1)[:, : x.shape[-1]].bool()
    if allowed.shape[-1] < x.shape[-1]:  # padded vocabulary rows the grammar never allows
        pad = torch.zeros(allowed.shape[0], x.shape[-1] - allowed.shape[-1], dtype=torch.bool, device=x.device)
        allowed = torch.cat([allowed, pad], dim=-1)
    rows = torch.tensor(tb.rows, device=x.device)
    x[rows] = x[rows].masked_fill(~allowed, float("-inf"))


def _apply_penalties(x: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    dev = x.device
    rows, vocab = x.shape
    outs = [s.token_ids[s.num_prompt_tokens:] for s in seqs]
    prompts = [s.token_ids[: s.num_prompt_tokens] for s in seqs]
    counts = _bincount_rows(outs, rows, vocab, dev)
    params = [s.request.params for s in seqs]
    rep = torch.tensor([p.repetition_penalty for p in params], device=dev).unsqueeze(1)
    if bool((rep != 1.0).any()):
        seen = (counts > 0) | (_bincount_rows(prompts, rows, vocab, dev) > 0)
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], device=dev).unsqueeze(1)
    return x - freq * counts - pres * (counts > 0).float()


def _bincount_rows(token_lists: list[list[int]], rows: int, vocab: int, dev: torch.device) -> torch.Tensor:
    counts = torch.zeros(rows, vocab, device=dev)
    flat = [t for ts in token_lists for t in ts]
    if flat:
        row_ids = torch.repeat_interleave(torch.arange(rows, device=dev),
                                          torch.tensor([len(ts) for ts in token_lists], device=dev))
        counts.index_put_((row_ids, torch.tensor(flat, device=dev)), torch.ones(len(flat), device=dev), accumulate=True)
    return counts


def _fill_logprobs(logits: torch.Tensor, rows: list[int], params: list[SamplingParams], tokens: list[int],
                   out: list[TokenLogprobs | None]) -> None:
    lp = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = lp.gather(1, torch.tensor([tokens[i] for i in rows], device=lp.device).unsqueeze(1)).squeeze(1).tolist()
    k_max = max(params[i].logprobs or 0 for i in rows)
    top_v: list[list[float]] = [[] for _ in rows]
    top_i: list[list[int]] = [[] for _ in rows]
    if k_max > 0:
        v, ix = lp.topk(k_max, dim=-1)
        top_v, top_i = v.tolist(), ix.tolist()
    for j, i in enumerate(rows):
        k = params[i].logprobs or 0
        out[i] = TokenLogprobs(tokens[i], chosen[j], list(zip(top_i[j][:k], top_v[j][:k])))
