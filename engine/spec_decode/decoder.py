"""Speculative decoding inside the continuous batch: the engine's hooks around one step.

    propose(running)   before ``schedule()``: each eligible decoding sequence gets up to k proposed
                       tokens appended to its ``token_ids``, so the scheduler sees k+1 uncomputed
                       tokens and budgets (token budget, KV blocks) for them like any chunk;
    plan(out)          after ``schedule()``: drafts of sequences the plan left out (budget, preemption)
                       are removed, those of a shortened chunk trimmed; returns the logits rows the
                       runner must keep (k+1 per speculating sequence);
    verify(...)        after the ONE target forward (paged attention over each sequence's k+1 query
                       tokens, each token's own adapter through SGMV): acceptance per sequence; the
                       rejected drafts leave ``token_ids`` and each chunk is cut to the tokens whose KV
                       is verified (the last one plus the accepted drafts), BEFORE ``Scheduler.update``
                       advances ``num_computed_tokens`` and registers full blocks with the prefix cache:
                       a block hash never covers an unverified token;
    rollback(out)      after ``Scheduler.update``: blocks past the verified KV go back to the pool.
The engine books the accepted drafts (already in the text) and the target's own token through
``Scheduler.update_from_output`` with the usual stop checks, and charges the fair-share policy for
emitted tokens only. Requests with stop strings do not speculate (those are matched on text after
the step, and several tokens at once could run past where plain decoding stops).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..config import EngineConfig
from ..kv_cache import KVCacheManager
from ..models import ModelConfig
from ..sampler import process_logits, truncated_probs
from ..scheduler import ScheduledChunk, SchedulerOutput
from ..sequence import Sequence, SequenceStatus
from .acceptance import verify_greedy, verify_sampled
from .adaptive import AdaptiveK, SpecState
from .ngram import NgramProposer

if TYPE_CHECKING:
    from .draft import DraftModelProposer

log = logging.getLogger("loraplex.engine.spec")


@dataclass
class _Pending:
    seq: Sequence
    tokens: list[int]
    probs: torch.Tensor | None
    base: int  # verified length of token_ids (drafts start here)
    chunk: ScheduledChunk | None = None


class SpeculativeDecoder:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        kv: KVCacheManager,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
    ):
        self.eos_token_ids = eos_token_ids
        self.method = config.speculative_method
        self.k = config.num_speculative_tokens
        self.adaptive = AdaptiveK(self.k, enabled=config.speculative_adaptive)
        self.kv = kv
        self.max_model_len = max_model_len
        self.ngram = NgramProposer(config.ngram_max_n, config.ngram_min_n) if self.method == "ngram" else None
        self.draft: DraftModelProposer | None = None
        if self.method == "draft":
            from .draft import DraftModelProposer  # loads a second model: only when asked for

            self.draft = DraftModelProposer(config, model_config, max_model_len)
        self._states: dict[int, SpecState] = {}
        self._pending: dict[int, _Pending] = {}
        self.counters = {
            "proposed_tokens": 0,
            "accepted_tokens": 0,
            "emitted_tokens": 0,
            "verifications": 0,
            "draft_failures": 0,
        }

    # ------------------------------------------------------------------ before schedule()
    def propose(self, running: list[Sequence]) -> None:
        live = {s.seq_id for s in running}
        for seq_id in [s for s in self._states if s not in live]:
            del self._states[seq_id]
        if self.draft is not None:
            self.draft.release_finished(live)
        seqs, ks = [], []
        free = self.kv.num_free_blocks - self.kv.watermark_blocks
        for seq in running:
            p = seq.request.params
            # Stop strings are matched on text after the step, per sequence: several tokens at once
            # could run past the point where plain decoding stops, so those requests decode plainly.
            # Penalties and grammars depend on every earlier token, logprobs are reported per
            # sampled token: those requests decode plainly too.
            if (
                not (p.speculative and seq.in_decode and seq.status is SequenceStatus.RUNNING)
                or p.stop
                or p.has_penalties
                or p.structured_output is not None
                or p.logprobs is not None
            ):
                continue
            state = self._states.setdefault(seq.seq_id, SpecState())
            k = min(
                self.adaptive.next_k(state),
                p.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - seq.num_tokens - 1,
            )
            if k <= 0:
                continue
            # Proposals may take only blocks that are free anyway: speculation must never be the
            # reason another sequence gets preempted.
            extra = self.kv.num_new_blocks(seq, 1 + k) - self.kv.num_new_blocks(seq, 1)
            if extra > free:
                continue
            free -= extra
            seqs.append(seq)
            ks.append(k)
        if not seqs:
            return
        proposals: list[tuple[list[int], torch.Tensor | None]]
        if self.ngram is not None:
            proposals = [(self.ngram.propose(s.token_ids, k), None) for s, k in zip(seqs, ks)]
        else:
            try:
                assert self.draft is not None, "speculation without a proposer"
                proposals = [(p.tokens, p.probs) for p in self.draft.propose(seqs, ks)]
            except Exception:  # a failing draft must not take the target down: decode plainly
                log.exception("draft model proposal failed; decoding without speculation this step")
                self.counters["draft_failures"] += 1
                return
        for seq, (tokens, probs) in zip(seqs, proposals):
            if tokens:
                self._pending[seq.seq_id] = _Pending(seq, list(tokens), probs, seq.num_tokens)
                seq.token_ids.extend(tokens)

    # ------------------------------------------------------------------ after schedule()
    def plan(self, out: SchedulerOutput) -> dict[int, int]:
        chunks = {c.seq.seq_id: c for c in out.chunks}
        rows: dict[int, int] = {}
        for seq_id, pend in list(self._pending.items()):
            chunk = chunks.get(seq_id)
            # The chunk starts at the last verified token; it covers num_tokens - 1 drafts.
            covered = 0 if chunk is None else chunk.num_tokens - 1
            if covered < len(pend.tokens):
                del pend.seq.token_ids[pend.base + covered :]
                pend.tokens = pend.tokens[:covered]
                if pend.probs is not None:
                    pend.probs = pend.probs[:covered]
            if covered == 0:
                del self._pending[seq_id]
                continue
            pend.chunk = chunk
            rows[seq_id] = covered + 1
        return rows

    def cancel(self) -> None:
        """The step failed: take every draft back out of the text."""
        for pend in self._pending.values():
            del pend.seq.token_ids[pend.base :]
        self._pending.clear()

    # ------------------------------------------------------------------ after the target forward
    def verify(
        self, seqs: list[Sequence], logits: torch.Tensor | None, generator: torch.Generator
    ) -> tuple[list[Sequence], torch.Tensor | None, list[tuple[Sequence, int, int]]]:
        """Split the runner's rows: plain sampling rows (returned with their sequences) and, per
        speculating sequence, (seq, the target's own token, number of accepted drafts). Accepted
        drafts stay in ``token_ids`` (their KV is computed and the update hashes full blocks from
        the text); the target's token is booked by ``Scheduler.update_from_output`` like any
        sampled token. A stop token among the accepted drafts ends the run there, as plain
        decoding would: that token becomes the booked one."""
        if not self._pending:
            return seqs, logits, []
        assert logits is not None
        plain_rows: list[int] = []
        verified: list[tuple[Sequence, int, int]] = []
        i = 0
        while i < len(seqs):
            seq = seqs[i]
            pend = self._pending.get(seq.seq_id)
            if pend is None:
                plain_rows.append(i)
                i += 1
                continue
            d = len(pend.tokens)
            rows = logits[i : i + d + 1]
            i += d + 1
            p = seq.request.params
            # The sampler's own processing (logit_bias; requests with penalties, grammars or
            # logprobs do not speculate) and its own truncated distribution.
            x = process_logits(rows, [seq] * (d + 1))
            if p.greedy:
                tokens = verify_greedy(pend.tokens, x.argmax(dim=-1).tolist())
            else:
                target = truncated_probs(x, [p] * (d + 1))
                tokens = verify_sampled(pend.tokens, pend.probs, target, seq.generator or generator)
            accepted = len(tokens) - 1
            self.adaptive.update(self._states.setdefault(seq.seq_id, SpecState()), d, accepted)
            c = self.counters
            c["proposed_tokens"] += d
            c["accepted_tokens"] += accepted
            c["verifications"] += 1
            for j, token in enumerate(tokens[:-1]):
                if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                    tokens, accepted = tokens[: j + 1], j
                    break
            c["emitted_tokens"] += len(tokens)
            del seq.token_ids[pend.base + accepted :]  # rejected drafts out
            assert pend.chunk is not None  # plan() set it: this sequence has rows in the step
            pend.chunk.num_tokens = 1 + accepted  # KV of rejected drafts is not "computed"
            verified.append((seq, tokens[-1], accepted))
        plain_seqs = [seqs[r] for r in plain_rows]
        plain_logits = logits[plain_rows] if plain_rows else None
        return plain_seqs, plain_logits, verified

    def rollback(self) -> None:
        """After ``Scheduler.update``: free the blocks that held only rejected drafts' KV."""
        for pend in self._pending.values():
            if pend.seq.status is SequenceStatus.RUNNING:
                self.kv.truncate(pend.seq, pend.seq.num_computed_tokens)
        self._pending.clear()

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        c: dict[str, Any] = dict(self.counters)
        c["method"] = self.method
        c["num_speculative_tokens"] = self.k
        c["acceptance_rate"] = c["accepted_tokens"] / c["proposed_tokens"] if c["proposed_tokens"] else 0.0
        # Tokens one verification emits (accepted drafts + the target's own token).
        c["mean_accepted_length"] = c["emitted_tokens"] / c["verifications"] if c["verifications"] else 0.0
        if self.draft is not None:
            c.update(self.draft.stats())
        return c
