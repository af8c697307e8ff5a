"""Draft-model proposer: a smaller checkpoint with the target's tokenizer runs k cheap steps.

It reuses the engine's own pieces: a ``ModelRunner`` (our model, kernels, paged KV) and a
``KVCacheManager`` with its own small block pool. Each target sequence has a shadow ``Sequence``
here whose ``num_computed_tokens`` says how much of the text the draft's KV covers. Per engine step:
  1. sync: the shadow's tokens become the target's verified tokens; draft KV beyond the first
     difference (rejected proposals) is dropped and its blocks go back to the pool;
  2. one batched draft forward over every shadow's uncomputed tail (a prefill for a new sequence,
     the last accepted tokens otherwise) yields each sequence's first proposal;
  3. k-1 batched one-token decode forwards yield the rest.
The draft runs on the base model (no adapter). A shadow whose KV does not fit in the draft's pool is
dropped and simply does not speculate this step. Greedy requests get the draft's argmax; sampled
ones draw from the draft's own distribution q (same temperature/top-k/top-p), which the rejection
rule needs, with a per-request generator derived from the request's seed.
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import EngineConfig
from ..kv_cache import KVCacheManager
from ..model_runner import ModelRunner, default_num_kv_blocks
from ..models import ModelConfig
from ..sampler import process_logits, truncated_probs
from ..scheduler import ScheduledChunk, SchedulerOutput
from ..sequence import Request, Sequence

DRAFT_SEED_OFFSET = 0x5EED


@dataclasses.dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V] draft distribution (sampled requests), else None


class DraftModelProposer:
    def __init__(self, config: EngineConfig, target: ModelConfig, max_model_len: int):
        assert config.draft_model is not None
        self.mc = ModelConfig.from_dir(config.draft_model)
        if self.mc.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({self.mc.vocab_size}) differs from the target's "
                f"({target.vocab_size}): the draft must share the target's tokenizer"
            )
        dcfg = dataclasses.replace(
            config,
            model=config.draft_model,
            quantization=None,
            speculative_method=None,
            draft_model=None,
            kv_cache_memory_gb=config.draft_kv_cache_memory_gb,
            num_kv_blocks=config.draft_num_kv_blocks,
            enable_prefix_caching=False,
        )
        dtype = dcfg.torch_dtype(self.mc.checkpoint_dtype)
        num_blocks = dcfg.num_kv_blocks or default_num_kv_blocks(dcfg, self.mc, dtype, max_model_len)
        self.runner = ModelRunner(dcfg, self.mc, max_model_len, num_blocks)
        self.kv = KVCacheManager(num_blocks, config.block_size, watermark=0.0)
        self.token_budget = config.max_num_batched_tokens
        self.device = self.runner.device
        self._shadows: dict[int, Sequence] = {}
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed + DRAFT_SEED_OFFSET)

    # ------------------------------------------------------------------ shadow bookkeeping
    def _shadow(self, seq: Sequence) -> Sequence:
        sh = self._shadows.get(seq.seq_id)
        if sh is None:
            req = Request(request_id=f"draft:{seq.request.request_id}", prompt_token_ids=[], params=seq.request.params)
            sh = Sequence(
                request=req, index=seq.index, token_ids=list(seq.token_ids), num_prompt_tokens=seq.num_prompt_tokens
            )
            if seq.request.params.seed is not None:
                sh.generator = torch.Generator(device=self.device).manual_seed(
                    seq.request.params.seed + seq.index + DRAFT_SEED_OFFSET
                )
            self._shadows[seq.seq_id] = sh
            return sh
        # Keep the draft KV of the longest common prefix with the target's verified text.
        target, mine = seq.token_ids, sh.token_ids
        common = min(len(target), len(mine), sh.num_computed_tokens)
        for i in range(common):
            if target[i] != mine[i]:
                common = i
                break
        sh.token_ids = list(target)
        if common < sh.num_computed_tokens:
            sh.num_computed_tokens = common
            self.kv.truncate(sh, common)
        return sh

    def release_finished(self, live_seq_ids: set[int]) -> None:
        for seq_id in [s for s in self._shadows if s not in live_seq_ids]:
            self.kv.free(self._shadows.pop(seq_id))

    def _drop(self, seq_id: int) -> None:
        sh = self._shadows.pop(seq_id, None)
        if sh is not None:
            self.kv.free(sh)

    # ------------------------------------------------------------------ proposals
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        results = [Proposal([], None) for _ in seqs]
        active: list[tuple[int, Sequence]] = []
        budget = self.token_budget
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            if k <= 0:
                continue
            sh = self._shadow(seq)
            if sh.num_uncomputed_tokens == 0:  # the last token's logits are needed: recompute it
                sh.num_computed_tokens -= 1
            n = sh.num_uncomputed_tokens
            if n > budget or not self.kv.can_append(sh, n):
                if not self.kv.can_append(sh, n):
                    self._drop(seq.seq_id)  # no room in the draft pool: recompute later
                continue
            budget -= n
            active.append((i, sh))
        want = {i: ks[i] for i, _ in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in active}
        step = 0
        while active:
            out = SchedulerOutput()
            for _, sh in active:
                n = sh.num_uncomputed_tokens
                self.kv.allocate(sh, n)
                out.chunks.append(ScheduledChunk(sh, n))
            rows, logits = self.runner.forward(out, self.kv)
            assert logits is not None  # every chunk ends at a new token: each has a logit row
            for chunk in out.chunks:
                chunk.seq.num_computed_tokens += chunk.num_tokens
            row_of = {id(s): r for r, s in enumerate(rows)}
            still = []
            for i, sh in active:
                p = sh.request.params
                x = process_logits(logits[row_of[id(sh)]].unsqueeze(0), [sh])
                if p.greedy:
                    token = int(x[0].argmax())
                else:
                    q = truncated_probs(x, [p])[0]
                    token = int(torch.multinomial(q, 1, generator=sh.generator or self._generator))
                    probs[i].append(q)
                sh.token_ids.append(token)
                results[i].tokens.append(token)
                if step + 1 < want[i] and self.kv.can_append(sh, 1):
                    still.append((i, sh))
            active = still
            step += 1
        for i, qs in probs.items():
            if qs:
                results[i].probs = torch.stack(qs)
        return results

    def stats(self) -> dict:
        return {
            "draft_kv_blocks": self.kv.num_blocks,
            "draft_kv_free_blocks": self.kv.num_free_blocks,
            "draft_sequences": len(self._shadows),
        }
