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
Proposers per row: with ``method="draft"``, a row runs the draft model when the draft can apply
its adapter (base rows always; adapter rows when the draft shares or mirrors the target's LoRA
slots and the row's adapter is resident), and the n-gram proposer otherwise, so an adapter row is
never verified against the base model's guesses and a row that gets no proposal just decodes.
Every request speculates except those asking for logprobs (reported per sampled token): penalties,
token masks (min_tokens, bad words) and grammars are applied per verified position with that
position's own history (the drafts before it), and stop strings are matched token by token by the
output processor, which cuts the emitted run at the token where plain decoding would have stopped.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

import torch

from ..config import EngineConfig
from ..kv_cache import KVCacheManager
from ..models import ModelConfig
from ..sampler import process_logits, truncated_probs
from ..sequence import AdapterRef, Sequence, SequenceStatus
from .acceptance import verify_greedy, verify_sampled
from .adaptive import AdaptiveK, SpecState
from .ngram import NgramProposer

if TYPE_CHECKING:
    from ..lora import LoRAManager
    from ..models.llama import LlamaForCausalLM
    from ..structured_output import StructuredOutputManager
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
        *,
        target_model: LlamaForCausalLM | None = None,
        lora: LoRAManager | None = None,
        structured: StructuredOutputManager | None = None,
    ):
        self.eos_token_ids = eos_token_ids
        self.structured = structured
        self.method = config.speculative_method
        self.k = config.num_speculative_tokens
        self.adaptive = AdaptiveK(self.k, enabled=config.speculative_adaptive)
        self.kv = kv
        self.max_model_len = max_model_len
        # The n-gram proposer serves every row with method "ngram", and with "draft" the rows the
        # draft cannot serve (an adapter it cannot apply).
        self.ngram = NgramProposer(config.ngram_max_n, config.ngram_min_n)
        self.draft: DraftModelProposer | None = None
        if self.method == "draft":
            from .draft import DraftModelProposer  # loads a second model: only when asked for

            self.draft = DraftModelProposer(config, model_config, max_model_len, target_model, lora)
        self._states: dict[int, SpecState] = {}
        self._draft_probs: dict[int, torch.Tensor] = {}  # seq_id -> q of its drafts (draft model, sampled)
        self.counters = {
            "proposed_tokens": 0,
            "accepted_tokens": 0,
            "emitted_tokens": 0,
            "verifications": 0,
            "draft_failures": 0,
            "draft_rows": 0,  # proposals asked of the draft model
            "ngram_rows": 0,  # proposals asked of the n-gram proposer (with "draft": the fallback rows)
        }

    # ------------------------------------------------------------------ before schedule()
    def propose(self, running: list[Sequence], resident: dict[AdapterRef, int] | None = None) -> None:
        """``resident``: the LoRA slot of every resident adapter (``LoRAManager.resident_slots``)."""
        self._draft_probs.clear()
        for seq in running:
            seq.spec_token_ids = []
        live = {s.seq_id for s in running}
        for seq_id in [s for s in self._states if s not in live]:
            del self._states[seq_id]
        if self.draft is not None:
            self.draft.release_finished(live)
        seqs, ks = [], []
        room = self.kv.headroom()
        for seq in running:
            p = seq.request.params
            # Logprobs are reported per sampled token from the sampler's pass: those requests
            # decode plainly. Everything else the sampler does is redone per verified position.
            if not (p.speculative and seq.in_decode and seq.status is SequenceStatus.RUNNING) or p.logprobs is not None:
                continue
            state = self._states.setdefault(seq.seq_id, SpecState())
            k = min(
                self.adaptive.next_k(state),
                p.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - seq.num_tokens - 1,
            )
            if k <= 0:
                continue
            if not room.take_lookahead(seq, k):  # only blocks free anyway: never a preemption
                continue
            seqs.append(seq)
            ks.append(k)
        if not seqs:
            return
        proposals: list[tuple[list[int], torch.Tensor | None]] = [([], None)] * len(seqs)
        resident = resident or {}
        by_draft = [
            i
            for i, s in enumerate(seqs)
            if self.draft is not None
            and (s.request.adapter is None or (self.draft.applies_adapters and s.request.adapter in resident))
        ]
        drafted = set(by_draft)
        for i, (s, k) in enumerate(zip(seqs, ks)):
            if i not in drafted:
                proposals[i] = (self.ngram.propose(s.token_ids, k), None)
                self.counters["ngram_rows"] += 1
        if by_draft:
            assert self.draft is not None
            slots = {ref.name: slot for ref, slot in resident.items()}
            try:
                got = self.draft.propose([seqs[i] for i in by_draft], [ks[i] for i in by_draft], slots)
                for i, prop in zip(by_draft, got):
                    proposals[i] = (prop.tokens, prop.probs)
                self.counters["draft_rows"] += len(by_draft)
            except Exception:  # a failing draft must not take the target down: those rows decode plainly
                log.exception("draft model proposal failed; its rows decode without speculation this step")
                self.counters["draft_failures"] += 1
        for seq, (tokens, probs) in zip(seqs, proposals):
            seq.spec_token_ids = list(tokens)
            if probs is not None and tokens:
                self._draft_probs[seq.seq_id] = probs

    # ------------------------------------------------------------------ in the runner, after the forward
    def verify(
        self, seq: Sequence, drafts: list[int], logits: torch.Tensor, generator: torch.Generator
    ) -> tuple[list[int], bool]:
        """``logits``: the target's 1 + len(drafts) rows for ``seq`` (the scheduler may have kept
        only a prefix of its proposals). Returns the accepted drafts followed by the target's own
        token, and whether the sequence's grammar is complete after them. A stop token (or the end
        of the grammar) among the accepted drafts ends the run there, as plain decoding would."""
        d = len(drafts)
        probs = self._draft_probs.pop(seq.seq_id, None)
        p = seq.request.params
        # Position j is judged as plain decoding would judge it after drafts[:j]: the grammar's
        # mask in that state, penalties and token masks over that history.
        bitmask = None
        if self.structured is not None and self.structured.has_matcher(seq):
            bitmask, valid = self.structured.bitmask_along(seq, drafts)
            drafts, d = drafts[:valid], valid  # a draft the grammar refuses ends what can be accepted
            logits = logits[: d + 1]
        rows: list[Sequence] = [seq] * (d + 1)
        if p.has_penalties or p.has_masks:
            rows = [_with_history(seq, drafts[:j]) for j in range(d + 1)]
        x = process_logits(logits, rows, bitmask, self.eos_token_ids)
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
        grammar_done = False
        if bitmask is not None:
            assert self.structured is not None
            for j, token in enumerate(tokens):
                if self.structured.accept(seq, token):
                    tokens, grammar_done = tokens[: j + 1], True
                    break
        c["emitted_tokens"] += len(tokens)
        return tokens, grammar_done

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


def _with_history(seq: Sequence, drafts: list[int]) -> Sequence:
    """A shallow view of ``seq`` whose history ends with ``drafts`` (what the sampler's penalties
    and token masks read), for judging the position after them."""
    if not drafts:
        return seq
    view = copy.copy(seq)
    view.token_ids = seq.token_ids + drafts
    return view
