"""Draft-model proposer: a smaller checkpoint with the target's tokenizer runs k cheap steps.

It reuses the engine's own pieces: a ``ModelRunner`` (our model, kernels, paged KV) and a
``KVCacheManager`` with its own small block pool. Each target sequence has a shadow ``Sequence``
here whose ``num_computed_tokens`` says how much of the text the draft's KV covers. Per engine step:
  1. sync: the shadow's tokens become the target's verified tokens; draft KV beyond the first
     difference (rejected proposals) is dropped and its blocks go back to the pool;
  2. one batched draft forward over every shadow's uncomputed tail (a prefill for a new sequence,
     the last accepted tokens otherwise) yields each sequence's first proposal;
  3. k-1 batched one-token decode forwards yield the rest.
Adapters: a draft that IS the target (``draft_model`` is the target's directory; with
``draft_num_layers``, its first layers only: self-speculation) shares the target's module, so its
projections hold the target's LoRA slots; a different checkpoint whose projections have the
target's shapes gets every slot write mirrored into it (``LoRAManager.mirror_into``). Either way
``applies_adapters`` is True and a row runs the draft with its own adapter, at the slot the LoRA
manager holds it in; otherwise the decoder sends adapter rows to the n-gram proposer instead (a
base-model draft would propose the base model's text for them). A shadow whose KV does not fit in
the draft's pool is dropped and simply does not speculate this step. Greedy requests get the draft's argmax; sampled
ones draw from the draft's own distribution q (same temperature/top-k/top-p), which the rejection
rule needs, with a per-request generator derived from the request's seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import EngineConfig
from ..kv_cache import KVCacheManager, default_num_kv_blocks
from ..model_runner import ModelRunner
from ..models import ModelConfig
from ..sampler import process_logits, truncated_probs
from ..scheduler_output import ScheduledChunk, SchedulerOutput
from ..sequence import Request, Sequence

if TYPE_CHECKING:
    from ..lora import LoRAManager
    from ..models.llama import LlamaForCausalLM

DRAFT_SEED_OFFSET = 0x5EED


@dataclasses.dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V] draft distribution (sampled requests), else None


def same_checkpoint(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


class DraftModelProposer:
    def __init__(
        self,
        config: EngineConfig,
        target: ModelConfig,
        max_model_len: int,
        target_model: LlamaForCausalLM | None = None,
        lora: LoRAManager | None = None,
    ):
        """``target_model``: the target's loaded module, shared when the draft is the target's own
        checkpoint; ``lora``: the target's LoRA manager (adapter rows then run their adapter here)."""
        assert config.draft_model is not None
        self.mc = ModelConfig.from_dir(config.draft_model)
        if self.mc.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({self.mc.vocab_size}) differs from the target's "
                f"({target.vocab_size}): the draft must share the target's tokenizer"
            )
        n = config.draft_num_layers
        if n is not None:
            if n > self.mc.num_layers:
                raise ValueError(f"draft_num_layers ({n}) exceeds the draft model's {self.mc.num_layers} layers")
            self.mc = dataclasses.replace(self.mc, num_layers=n)  # the runner keeps KV for n layers, runs n
        shared = target_model if same_checkpoint(config.draft_model, config.model) else None
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
        self.runner = ModelRunner(dcfg, self.mc, max_model_len, num_blocks, model=shared)
        self.shares_target = shared is not None
        self.applies_adapters = lora is not None and (self.shares_target or lora.slots.mirror_into(self.runner.model))
        self.kv = KVCacheManager(num_blocks, config.block_size, watermark=0.0)
        self.token_budget = config.max_num_batched_tokens
        self.device = self.runner.device
        self._shadows: dict[int, Sequence] = {}
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed + DRAFT_SEED_OFFSET)

    # ------------------------------------------------------------------ shadow bookkeeping
    def _shadow(self, seq: Sequence) -> Sequence:
        sh = self._shadows.get(seq.seq_id)
        if sh is None:
            req = Request(
                request_id=f"draft:{seq.request.request_id}",
                prompt_token_ids=[],
                params=seq.request.params,
                adapter=seq.request.adapter,  # the draft forward looks its slot up by name
            )
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
    def propose(
        self, seqs: list[Sequence], ks: list[int], adapter_slots: dict[str, int] | None = None
    ) -> list[Proposal]:
        """``adapter_slots``: name -> LoRA slot of every adapter among ``seqs`` (``applies_adapters``)."""
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
            rows, logits = self.runner.forward(out, self.kv, adapter_slots)
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
            "draft_shares_target": self.shares_target,
            "draft_applies_adapters": self.applies_adapters,
        }
