"""Batched token sampling: one pass over the whole step's logits, whatever each row asks for.

Per row: an allowed-token bitmask (structured output), logit_bias, presence / frequency /
repetition penalties, then greedy, or temperature -> top-k -> top-p -> min-p -> a draw. Every
stage runs as one tensor operation over the rows that need it (a batch that mixes 64 different
parameter sets costs one pass, not 64); rows that need nothing skip the stage entirely.

Draws invert each row's CDF at one uniform number: rows with a seed take theirs from their own
generator, so a seeded sequence gives the same tokens whatever else is in the batch; the other
rows share one vectorised draw. (An exponential race over the whole vocabulary costs V random
numbers per row; the CDF costs one.)

Logprobs are the model's own distribution (log-softmax of the raw logits, before penalties, bias,
grammar mask and temperature; vLLM's ``raw_logprobs``), computed only for the rows that ask.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from itertools import chain

import torch

from .sampling_params import SamplingParams
from .sequence import Sequence


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the k most likely tokens, most likely first
    rank: int | None = None  # 1 + how many tokens are more likely (prompt logprobs report it)


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


def sample(
    logits: torch.Tensor,
    seqs: Seq[Sequence],
    default_generator: torch.Generator,
    token_bitmask: TokenBitmask | None = None,
    eos_token_ids: frozenset[int] = frozenset(),
) -> list[int]:
    return sample_batch(logits, seqs, default_generator, token_bitmask, eos_token_ids).tokens


def sample_batch(
    logits: torch.Tensor,
    seqs: Seq[Sequence],
    default_generator: torch.Generator,
    token_bitmask: TokenBitmask | None = None,
    eos_token_ids: frozenset[int] = frozenset(),
) -> SamplerOutput:
    """logits: [len(seqs), vocab]. Never modifies ``logits`` (forks re-sample from the same rows).
    ``eos_token_ids``: what ``min_tokens`` holds back (with each request's stop_token_ids)."""
    if not seqs:
        return SamplerOutput([], [])
    params = [s.request.params for s in seqs]
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    x = process_logits(logits, seqs, token_bitmask, eos_token_ids)
    draw_rows = [i for i, p in enumerate(params) if not p.greedy]
    if len(draw_rows) < len(seqs):
        tokens = x.argmax(dim=-1)
    else:  # every row draws: no full-vocabulary argmax needed
        tokens = torch.zeros(len(seqs), dtype=torch.long, device=x.device)
    if draw_rows:
        # One uniform per row (a seeded row draws it from its own generator), then inverse CDF.
        u = torch.rand(len(draw_rows), generator=default_generator, device=x.device)
        for j, i in enumerate(draw_rows):
            gen = seqs[i].generator
            if gen is not None:
                u[j] = torch.rand(1, generator=gen, device=x.device)
        for rows, probs, ids in _draw_groups(x[draw_rows], [params[i] for i in draw_rows]):
            cdf = probs.cumsum(dim=-1)
            picked = torch.searchsorted(cdf, (u[rows] * cdf[:, -1]).unsqueeze(1), right=True)
            picked = picked.clamp_(max=probs.shape[-1] - 1)
            if ids is not None:
                picked = ids.gather(1, picked)
            tokens[[draw_rows[r] for r in rows]] = picked.squeeze(1)
    token_list = tokens.tolist()
    logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
    if lp_rows:
        _fill_logprobs(logits, lp_rows, params, token_list, logprobs)
    return SamplerOutput(token_list, logprobs)


def advance_seeded_generator(generator: torch.Generator, num_tokens: int) -> None:
    """Bring a drawing sample's own generator to where ``sample_batch`` leaves it after
    ``num_tokens`` tokens: one uniform per token (greedy rows draw nothing). A request resumed
    on another engine (``EngineRequest.resume_token_ids``) then continues with the very draws the
    uninterrupted one would have made. Keep in step with the draw in ``sample_batch``."""
    if num_tokens <= 0:
        return
    if generator.device.type == "cpu":  # mt19937: k uniforms at once leave the state of k single draws
        torch.rand(num_tokens, generator=generator)  # (tests/engine/test_resume.py checks it)
        return
    for _ in range(num_tokens):  # Philox moves its offset per call: one call per token, as sampled
        torch.rand(1, generator=generator, device=generator.device)


def process_logits(
    logits: torch.Tensor,
    seqs: Seq[Sequence],
    token_bitmask: TokenBitmask | None = None,
    eos_token_ids: frozenset[int] = frozenset(),
) -> torch.Tensor:
    """A float32 copy of ``logits`` with grammar masks, vLLM's token masks (allowed_token_ids,
    bad_words, min_tokens), logit_bias and penalties applied."""
    x = logits.float().clone()
    if token_bitmask is not None and token_bitmask.rows:
        _apply_bitmask(x, token_bitmask)
    params = [s.request.params for s in seqs]
    mask_rows = [i for i, p in enumerate(params) if p.has_masks]
    if mask_rows:
        _apply_token_masks(x, mask_rows, seqs, eos_token_ids)
    bias_rows = [i for i, p in enumerate(params) if p.logit_bias]
    if bias_rows:
        _apply_logit_bias(x, bias_rows, params)
    pen_rows = [i for i, p in enumerate(params) if p.has_penalties]
    if pen_rows:
        _apply_penalties(x, pen_rows, seqs)
    return x


TOP_P_CANDIDATES = 256  # top-p rows first look at this many best tokens (enough for real peaked distributions)


def truncated_probs(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The full-vocabulary distribution each draw row samples from (tests compare it)."""
    out = torch.zeros_like(x)
    for rows, probs, ids in _draw_groups(x, params):
        out[rows] = (
            probs if ids is None else torch.zeros(len(rows), x.shape[-1], device=x.device).scatter_add_(1, ids, probs)
        )
    return out


def topk_canonical(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` with ties broken by the lower token id, in membership and in order.

    torch's order among equal values follows ``k`` and the rows beside it, and bf16 logits tie
    often (8 significant bits): a row's top logprobs, or the candidates a seeded top-k / top-p row
    draws from, would then depend on what else shares its step (the largest ``logprobs`` of the
    batch sets ``k`` for all) — against ``batch_invariant``'s promise. Here the top ``k`` are the
    first ``k`` of the row sorted by (value descending, id ascending), so ``topk_canonical(x, K)[:k]``
    is ``topk_canonical(x, k)``. Only rows with a tie inside their top ``k`` or at its edge are
    re-picked (two [rows, vocab] comparisons find them)."""
    vals, ids = x.topk(k, dim=-1)
    if k == 0 or x.shape[0] == 0:
        return vals, ids
    edge = vals[:, -1:]
    left_out = (x == edge).sum(dim=-1) > (vals == edge).sum(dim=-1)
    inside = (vals[:, 1:] == vals[:, :-1]).any(dim=-1) if k > 1 else torch.zeros_like(left_out)
    for r in (left_out | inside).nonzero().flatten().tolist():
        row, t = x[r], edge[r, 0]
        above = (row > t).nonzero().flatten()  # ascending ids
        cand = torch.cat([above, (row == t).nonzero().flatten()[: k - len(above)]])
        if len(cand) != k:  # NaNs in the row (torch ranks them first; no order to restore there)
            continue
        v = row[cand]
        order = torch.sort(v, descending=True, stable=True).indices  # stable: ids ascending among ties
        vals[r], ids[r] = v[order], cand[order]
    return vals, ids


def _draw_groups(
    x: torch.Tensor, params: list[SamplingParams]
) -> list[tuple[list[int], torch.Tensor, torch.Tensor | None]]:
    """Softmax of x / temperature after top-k, top-p and min-p, as (rows, probs, token ids or None).

    Rows with top-k or top-p live in candidate space (their k best, or the best
    ``TOP_P_CANDIDATES`` for top-p rows, widened 16x at a time while the nucleus is larger): they
    never sort, exponentiate or draw over the whole vocabulary. Other rows use the full row."""
    dev = x.device
    vocab = x.shape[-1]
    k_rows = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    trunc = [i for i, p in enumerate(params) if k_rows[i] < vocab or p.top_p < 1.0]
    full = [i for i in range(len(params)) if i not in set(trunc)]
    groups: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []
    if full:
        t = torch.tensor([params[i].temperature for i in full], device=dev).unsqueeze(1)
        groups.append((full, _min_p((x[full] / t).softmax(dim=-1), [params[i] for i in full]), None))
    if trunc:
        sub = [params[i] for i in trunc]
        cand = [k_rows[i] if k_rows[i] < vocab else min(vocab, TOP_P_CANDIDATES) for i in trunc]
        vals, ids = _truncate(x[trunc], cand, sub, [k_rows[i] == vocab for i in trunc])
        groups.append((trunc, _min_p(vals.softmax(dim=-1), sub), ids))
    return groups


def _min_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    min_p = torch.tensor([p.min_p for p in params], device=probs.device)
    if bool((min_p > 0).any()):
        floor = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _truncate(
    x: torch.Tensor, cand: list[int], params: list[SamplingParams], full_mass: list[bool]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-``cand`` tokens, then its top-p nucleus among them: (scaled logits with
    dropped ones at -inf, token ids), both [rows, max(cand)]. Rows flagged ``full_mass`` (top-p
    only) measure mass against the whole row; if their candidates hold less than top_p of it, the
    nucleus may lie beyond them and they are redone with 16x more candidates."""
    dev = x.device
    vocab = x.shape[-1]
    k = max(cand)
    temp = torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
    vals, ids = topk_canonical(x, k)  # sorted, best first; temperature keeps the order
    vals = vals / temp
    vals = vals.masked_fill(
        torch.arange(k, device=dev).unsqueeze(0) >= torch.tensor(cand, device=dev).unsqueeze(1), float("-inf")
    )
    fm = torch.tensor(full_mass, device=dev)
    lse = vals.logsumexp(dim=-1)
    wide = fm.nonzero().flatten()
    if len(wide):
        lse[wide] = (x[wide] / temp[wide]).logsumexp(dim=-1)
    p_sorted = (vals - lse.unsqueeze(1)).exp()
    tp = torch.tensor([p.top_p for p in params], device=dev)
    # Drop a token once the mass BEFORE it already reaches top_p (the top token always stays).
    drop = (p_sorted.cumsum(dim=-1) - p_sorted) >= tp.unsqueeze(1)
    vals = vals.masked_fill(drop, float("-inf"))
    short = (fm & (p_sorted.sum(dim=-1) < tp)).nonzero().flatten().tolist()
    if short and k < vocab:
        wider = min(vocab, k * 16)
        v2, i2 = _truncate(x[short], [wider] * len(short), [params[i] for i in short], [True] * len(short))
        pad = v2.shape[1] - k
        vals = torch.cat([vals, vals.new_full((len(vals), pad), float("-inf"))], dim=1)
        ids = torch.cat([ids, ids.new_zeros((len(ids), pad))], dim=1)
        vals[short], ids[short] = v2, i2
    return vals, ids


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


def _apply_token_masks(x: torch.Tensor, rows: list[int], seqs: Seq[Sequence], eos: frozenset[int]) -> None:
    """In place: -inf for what a row may not sample now. Only rows that ask pay anything."""
    vocab = x.shape[-1]
    for r in rows:
        seq = seqs[r]
        p = seq.request.params
        if p.allowed_token_ids is not None:
            x[r] = x[r].masked_fill(~_allowed_mask(p, vocab, x.device), float("-inf"))
        banned: set[int] = set()
        if p.bad_words_token_ids:
            banned.update(banned_by_bad_words(_bad_words_index(p), seq.token_ids, seq.num_prompt_tokens))
        if seq.num_output_tokens < p.min_tokens:
            banned.update(eos)
            banned.update(p.stop_token_ids)
        ids = [t for t in banned if t < vocab]
        if ids:
            x[r, torch.tensor(ids, dtype=torch.long, device=x.device)] = float("-inf")


_ALLOWED_CACHE_ATTR = "_allowed_mask_cache"
_BAD_WORDS_CACHE_ATTR = "_bad_words_index_cache"

# (tokens always banned: one-token words;
#  next-to-last token -> length of the tokens before it -> those tokens -> last tokens)
BadWordsIndex = tuple[frozenset[int], dict[int, dict[int, dict[tuple[int, ...], frozenset[int]]]]]


def _bad_words_index(p: SamplingParams) -> BadWordsIndex:
    """``p.bad_words_token_ids`` indexed by each word's next-to-last token, then by the tokens
    before it, built once per request: a step looks up the last output token, then one slice of
    the output per distinct word length, not every word (a scan of every word per step made a long
    list slow down the batch for everyone, and words sharing a prefix cost one lookup)."""
    cached: BadWordsIndex | None = getattr(p, _BAD_WORDS_CACHE_ATTR, None)
    if cached is not None:
        return cached
    always: set[int] = set()
    nested: dict[int, dict[int, dict[tuple[int, ...], set[int]]]] = {}
    for word in p.bad_words_token_ids:
        if len(word) == 1:
            always.add(word[0])
        else:
            rest = tuple(word[:-2])
            nested.setdefault(word[-2], {}).setdefault(len(rest), {}).setdefault(rest, set()).add(word[-1])
    by_prev = {
        prev: {k: {rest: frozenset(lasts) for rest, lasts in table.items()} for k, table in by_len.items()}
        for prev, by_len in nested.items()
    }
    index = (frozenset(always), by_prev)
    object.__setattr__(p, _BAD_WORDS_CACHE_ATTR, index)
    return index


def banned_by_bad_words(index: BadWordsIndex, token_ids: Seq[int], start: int) -> set[int]:
    """The last tokens of the bad words that the output (``token_ids[start:]``) already ends the
    rest of: vLLM's rule (a one-token word is always banned), without copying the output."""
    always, by_prev = index
    banned = set(always)
    end = len(token_ids)
    if end <= start:
        return banned
    for k, table in by_prev.get(token_ids[end - 1], {}).items():
        if end - 1 - k >= start:
            lasts = table.get(tuple(token_ids[end - 1 - k : end - 1]))
            if lasts:
                banned.update(lasts)
    return banned


_BIAS_CACHE_ATTR = "_logit_bias_cache"


def _apply_logit_bias(x: torch.Tensor, rows: list[int], params: list[SamplingParams]) -> None:
    """In place: one scatter-add for every biased row of the step. Each request's (token ids,
    values) tensors are built once (a per-step Python walk over the entries of every row made a
    whole-vocabulary logit_bias slow down the batch for everyone)."""
    vocab = x.shape[-1]
    ids, vals, counts = [], [], []
    for r in rows:
        t, v = _bias_tensors(params[r], vocab, x.device)
        ids.append(t)
        vals.append(v)
        counts.append(len(t))
    row_idx = torch.tensor(rows, device=x.device).repeat_interleave(torch.tensor(counts, device=x.device))
    x.index_put_((row_idx, torch.cat(ids)), torch.cat(vals).to(x.dtype), accumulate=True)


def _bias_tensors(p: SamplingParams, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cached: tuple[int, torch.Tensor, torch.Tensor] | None = getattr(p, _BIAS_CACHE_ATTR, None)
    if cached is not None and cached[0] == vocab and cached[1].device == device:
        return cached[1], cached[2]
    items = [(t, b) for t, b in p.logit_bias.items() if t < vocab]
    ids = torch.tensor([t for t, _ in items], dtype=torch.long, device=device)
    vals = torch.tensor([b for _, b in items], dtype=torch.float32, device=device)
    object.__setattr__(p, _BIAS_CACHE_ATTR, (vocab, ids, vals))
    return ids, vals


def _allowed_mask(p: SamplingParams, vocab: int, device: torch.device) -> torch.Tensor:
    """The boolean mask of ``p.allowed_token_ids``, built once per request (a long list would
    otherwise be turned into a tensor at every step of every sequence that carries it)."""
    cached: torch.Tensor | None = getattr(p, _ALLOWED_CACHE_ATTR, None)
    if cached is not None and cached.shape[0] == vocab and cached.device == device:
        return cached
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    ids = [t for t in p.allowed_token_ids or () if t < vocab]
    if ids:
        mask[torch.tensor(ids, dtype=torch.long, device=device)] = True
    object.__setattr__(p, _ALLOWED_CACHE_ATTR, mask)
    return mask


def _apply_penalties(x: torch.Tensor, rows: list[int], seqs: Seq[Sequence]) -> None:
    """In place, touching only the (row, token) pairs that occurred: O(tokens seen), not O(vocab)."""
    dev = x.device
    vocab = x.shape[-1]
    outs = [seqs[r].token_ids[seqs[r].num_prompt_tokens :] for r in rows]
    prompts = [seqs[r].token_ids[: seqs[r].num_prompt_tokens] for r in rows]
    row_t = torch.tensor(rows, device=dev)
    out_len = torch.tensor([len(t) for t in outs], device=dev)
    prompt_len = torch.tensor([len(t) for t in prompts], device=dev)
    n_out = int(out_len.sum())
    flat = torch.tensor(
        list(chain.from_iterable(outs)) + list(chain.from_iterable(prompts)), dtype=torch.long, device=dev
    )
    if flat.numel() == 0:
        return
    flat_rows = torch.cat([row_t.repeat_interleave(out_len), row_t.repeat_interleave(prompt_len)])
    keys, inverse = torch.unique(flat_rows * vocab + flat, return_inverse=True)
    counts = torch.zeros(len(keys), device=dev).index_add_(0, inverse[:n_out], torch.ones(n_out, device=dev))
    r_idx, t_idx = keys // vocab, keys % vocab
    per_row = torch.zeros(3, x.shape[0], device=dev)
    per_row[0].fill_(1.0)
    for r in rows:
        p = seqs[r].request.params
        per_row[0, r], per_row[1, r], per_row[2, r] = p.repetition_penalty, p.frequency_penalty, p.presence_penalty
    rep, freq, pres = per_row[0, r_idx], per_row[1, r_idx], per_row[2, r_idx]
    v = x[r_idx, t_idx]
    v = torch.where(v > 0, v / rep, v * rep)  # repetition: prompt and output tokens alike
    v = v - freq * counts - pres * (counts > 0).float()  # frequency/presence: output tokens only
    x[r_idx, t_idx] = v


def _fill_logprobs(
    logits: torch.Tensor,
    rows: list[int],
    params: list[SamplingParams],
    tokens: list[int],
    out: list[TokenLogprobs | None],
) -> None:
    lp = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = lp.gather(1, torch.tensor([tokens[i] for i in rows], device=lp.device).unsqueeze(1)).squeeze(1).tolist()
    k_max = max(params[i].logprobs or 0 for i in rows)
    top_v: list[list[float]] = [[] for _ in rows]
    top_i: list[list[int]] = [[] for _ in rows]
    if k_max > 0:
        v, ix = topk_canonical(lp, k_max)
        top_v, top_i = v.tolist(), ix.tolist()
    for j, i in enumerate(rows):
        k = params[i].logprobs or 0
        out[i] = TokenLogprobs(tokens[i], chosen[j], list(zip(top_i[j][:k], top_v[j][:k])))


def prompt_logprobs(logits: torch.Tensor, targets: list[int], k: int) -> list[TokenLogprobs]:
    """One prompt token's logprob per row: row j's logits predict ``targets[j]`` (the raw model
    distribution, as for sampled tokens), its rank, and the ``k`` most likely tokens."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    want = torch.tensor(targets, device=lp.device).unsqueeze(1)
    chosen = lp.gather(1, want)
    ranks = (lp > chosen).sum(dim=-1).add_(1).tolist()
    values = chosen.squeeze(1).tolist()
    top_v: list[list[float]] = [[] for _ in targets]
    top_i: list[list[int]] = [[] for _ in targets]
    if k > 0:
        v, ix = topk_canonical(lp, k)
        top_v, top_i = v.tolist(), ix.tolist()
    return [TokenLogprobs(t, values[j], list(zip(top_i[j], top_v[j])), ranks[j]) for j, t in enumerate(targets)]
