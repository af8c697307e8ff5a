"""Speculative decoding inside the continuous batch: proposing drafts, verifying them.

    propose(running)   before ``schedule()``: each eligible decoding sequence gets up to k drafts
                       in ``seq.spec_token_ids`` (never in ``token_ids``). The scheduler budgets the
                       decode token plus the drafts that fit (token budget, KV blocks) as one chunk
                       and moves the scheduled drafts into it (``ScheduledChunk.spec_token_ids``);
    verify(...)        in the runner, after the ONE target forward (paged attention over each
                       sequence's 1 + d query tokens, each token's own adapter through SGMV): the
                       accepted drafts and the target's own token (exact greedy, or rejection
                       sampling against the draft's distribution).
``Scheduler.update_from_output`` books what verify returned: the accepted drafts join ``token_ids``,
only their KV counts as computed (so a prefix-cache hash never covers an unverified token), the
blocks of rejected drafts go back to the pool, and the policy is charged for emitted tokens only.
Requests with stop strings, penalties, grammars or logprobs do not speculate (stop strings are
matched on text after the step, the others depend on each earlier token or report per token).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from ..config import EngineConfig
from ..kv_cache import KVCacheManager
from ..models import ModelConfig
from ..sampler import process_logits, truncated_probs
from ..sequence import Sequence, SequenceStatus
from .acceptance import verify_greedy, verify_sampled
from .adaptive import AdaptiveK, SpecState
from .ngram import NgramProposer

if TYPE_CHECKING:
    from .draft import DraftModelProposer

log = logging.getLogger("loraplex.engine.spec")


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
        self._draft_probs: dict[int, torch.Tensor] = {}  # seq_id -> q of its drafts (draft model, sampled)
        self.counters = {
            "proposed_tokens": 0,
            "accepted_tokens": 0,
            "emitted_tokens": 0,
            "verifications": 0,
            "draft_failures": 0,
        }

    # ------------------------------------------------------------------ before schedule()
    def propose(self, running: list[Sequence]) -> None:
        self._draft_probs.clear()
        for seq in running:
            seq.spec_token_ids = []
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
            seq.spec_token_ids = list(tokens)
            if probs is not None and tokens:
                self._draft_probs[seq.seq_id] = probs

    # ------------------------------------------------------------------ in the runner, after the forward
    def verify(self, seq: Sequence, drafts: list[int], logits: torch.Tensor, generator: torch.Generator) -> list[int]:
        """``logits``: the target's 1 + len(drafts) rows for ``seq`` (the scheduler may have kept
        only a prefix of its proposals). Returns the accepted drafts followed by the target's own
        token. A stop token among the accepted drafts ends the run there, as plain decoding would."""
        d = len(drafts)
        probs = self._draft_probs.pop(seq.seq_id, None)
        p = seq.request.params
        # The sampler's own processing (logit_bias; requests with penalties, grammars or logprobs
        # do not speculate) and its own truncated distribution.
        x = process_logits(logits, [seq] * (d + 1))
        if p.greedy:
            tokens = verify_greedy(drafts, x.argmax(dim=-1).tolist())
        else:
            target = truncated_probs(x, [p] * (d + 1))
            tokens = verify_sampled(drafts, None if probs is None else probs[:d], target, seq.generator or generator)
        accepted = len(tokens) - 1
        self.adaptive.update(self._states.setdefault(seq.seq_id, SpecState()), d, accepted)
        c = self.counters
        c["proposed_tokens"] += d
        c["accepted_tokens"] += accepted
        c["verifications"] += 1
        for j, token in enumerate(tokens[:-1]):
            if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                tokens = tokens[: j + 1]
                break
        c["emitted_tokens"] += len(tokens)
        return tokens

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
