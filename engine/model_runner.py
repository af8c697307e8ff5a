"""Turns a scheduler step into tensors, runs the model once, and samples: the step's ``RunnerOutput``.

``execute(plan)`` is the model side of one engine step: the forward over every scheduled chunk,
then one batched sampler pass (grammar masks for constrained rows; n > 1 followers draw from their
leader's row), and for speculating sequences the verification of their drafts against the target's
k+1 rows (exact greedy or rejection sampling). What it returns is only tokens and counts; the
scheduler books them (``Scheduler.update_from_output``). ``forward`` alone gives logits (the draft
proposer runs its own small model through it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import torch

from loraplex.kernels import batch_invariant_ops, get_kernel_ops, make_lora_segments

from .config import EngineConfig
from .kv_cache import KVCacheManager
from .models import ModelConfig, load_model
from .models.forward_batch import ForwardBatch
from .models.quantization import quantize_model_int8, quantize_model_w8a8
from .models.quantization_int4 import quantize_model_int4
from .models.quantized_checkpoint import checkpoint_quantization
from .runner_output import RunnerOutput
from .sampler import TokenLogprobs, prompt_logprobs, sample_batch
from .scheduler_output import ScheduledChunk, SchedulerOutput
from .sequence import Sequence

if TYPE_CHECKING:
    from .models.llama import LlamaForCausalLM
    from .structured_output import StructuredOutputManager


class DraftVerifier(Protocol):
    """What the runner needs of speculative decoding (``spec_decode.SpeculativeDecoder``): the
    accepted drafts + the target's own token from a sequence's 1 + d logits rows, and whether its
    grammar is complete after them. A Protocol, so the runner does not import the decoder (whose
    draft proposer runs a ModelRunner of its own)."""

    def verify(
        self, seq: Sequence, drafts: list[int], logits: torch.Tensor, generator: torch.Generator
    ) -> tuple[list[int], bool]: ...


PROMPT_LOGPROBS_ROWS = 256  # prompt positions whose logits are materialised at once (prompt_logprobs)


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        max_model_len: int,
        num_kv_blocks: int,
        *,
        kv: KVCacheManager | None = None,
        structured: StructuredOutputManager | None = None,
        spec: DraftVerifier | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
        model: LlamaForCausalLM | None = None,
    ):
        """``kv``, ``structured`` and ``spec`` are what ``execute`` needs (the engine's runner);
        a runner used through ``forward`` alone (the draft model's) goes without them. ``model``:
        run this already loaded module instead of loading ``config.model`` (a draft that shares the
        target's weights and LoRA slots; its KV cache is still this runner's own)."""
        self.config = config
        self.kv = kv
        self.structured = structured
        self.spec = spec
        self.eos_token_ids = eos_token_ids  # min_tokens masks them
        self.model_config = model_config
        self.device = config.torch_device
        self.dtype = config.torch_dtype(model_config.checkpoint_dtype)
        self.ops = get_kernel_ops(config.kernel_backend, self.device)
        if config.batch_invariant:
            self.ops = batch_invariant_ops(self.ops)  # raises where the backend cannot hold it
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)  # unseeded draws
        self.seconds = {"forward": 0.0, "sample": 0.0}  # cumulative time per phase (stats)
        self.model: LlamaForCausalLM
        prequantized = checkpoint_quantization(config.model) if model is None else None
        if prequantized is not None and config.quantization == "w8a8":
            raise ValueError(
                f"{config.model} is a {prequantized.method.upper()} 4-bit checkpoint: quantization='w8a8' "
                "quantizes a full-precision checkpoint's weights to int8 at load and cannot start from 4-bit "
                "codes; serve it with quantization unset or 'int4', or point w8a8 at the unquantized model"
            )
        if prequantized is not None and config.quantization not in (None, "int4"):
            raise ValueError(
                f"{config.model} is a {prequantized.method.upper()} 4-bit checkpoint: serve it with "
                f"quantization unset or 'int4', not {config.quantization!r}"
            )
        if model is not None:
            self.model = model
        elif prequantized is not None:
            # The checkpoint's own 4-bit codes (its group size), head and embedding as it stores them.
            self.model = load_model(config.model, self.dtype, self.device, max_positions=max_model_len)
            self.model.pack_weights(self.ops)  # the float head's packed copy, if the backend keeps one
        elif config.quantization == "int4":
            # Loaded in float32 so the codes come from the checkpoint's own precision.
            self.model = load_model(config.model, torch.float32, self.device, max_positions=max_model_len)
            quantize_model_int4(self.model, self.dtype, config.quantization_group_size, self.ops.int8_linear)
        elif config.quantization == "int8":
            # Loaded in float32 so the int8 codes come from the checkpoint's own precision.
            self.model = load_model(config.model, torch.float32, self.device, max_positions=max_model_len)
            quantize_model_int8(self.model, self.dtype, self.ops.int8_linear)
        elif config.quantization == "w8a8":
            self.model = load_model(config.model, torch.float32, self.device, max_positions=max_model_len)
            quantize_model_w8a8(self.model, self.dtype, self.ops.w8a8_linear)
        else:
            self.model = load_model(config.model, self.dtype, self.device, max_positions=max_model_len)
            self.model.pack_weights(self.ops)
        shape = (num_kv_blocks, config.block_size, model_config.num_kv_heads, model_config.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(model_config.num_layers)
        ]

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput, adapter_slots: dict[str, int] | None = None) -> RunnerOutput:
        """Run one engine step: forward, sample, verify drafts."""
        assert self.kv is not None, "execute needs the engine's KV cache manager"
        t0 = time.perf_counter()
        result = RunnerOutput()
        seqs, logits = self.forward(plan, self.kv, adapter_slots, result.prompt_logprobs, result.nonfinite)
        t1 = time.perf_counter()
        if logits is not None:
            self._sample(plan, seqs, logits, result)
        self.seconds["forward"] += t1 - t0
        self.seconds["sample"] += time.perf_counter() - t1
        return result

    def _sample(self, plan: SchedulerOutput, seqs: list[Sequence], logits: torch.Tensor, result: RunnerOutput) -> None:
        """``seqs`` has one entry per logits row (a speculating sequence: 1 + drafts rows in a row)."""
        drafts = {c.seq.seq_id: c.spec_token_ids for c in plan.chunks if c.spec_token_ids}
        rows: list[int] = []  # logits row of each plainly sampled sequence (followers: the leader's)
        targets: list[Sequence] = []
        verify: list[tuple[Sequence, int]] = []  # (speculating sequence, its first row)
        i = 0
        while i < len(seqs):
            seq = seqs[i]
            if seq.seq_id in drafts:
                verify.append((seq, i))
                i += 1 + len(drafts[seq.seq_id])
                continue
            for target in (seq, *plan.forks.get(seq.seq_id, ())):
                rows.append(i)
                targets.append(target)
            i += 1
        tokens: dict[int, list[int]] = {}
        for seq, first in verify:
            assert self.spec is not None, "drafts scheduled without a speculative decoder"
            d = drafts[seq.seq_id]
            tokens[seq.seq_id], grammar_done = self.spec.verify(
                seq, d, logits[first : first + len(d) + 1], self.generator
            )
            result.num_accepted[seq.seq_id] = len(tokens[seq.seq_id]) - 1
            if grammar_done:
                result.grammar_finished.add(seq.seq_id)
        if targets:
            x = logits if len(rows) == len(seqs) else logits.index_select(0, torch.tensor(rows, device=logits.device))
            structured = self.structured if self.structured is not None and self.structured.active else None
            bitmask = structured.bitmask_for(targets) if structured is not None else None
            out = sample_batch(x, targets, self.generator, bitmask, self.eos_token_ids)
            for seq, token, lp in zip(targets, out.tokens, out.logprobs):
                tokens[seq.seq_id] = [token]
                if lp is not None:
                    result.logprobs[seq.seq_id] = lp
                if structured is not None and structured.accept(seq, token):
                    result.grammar_finished.add(seq.seq_id)
        order = [t for s in plan.sampling_seqs for t in (s, *plan.forks.get(s.seq_id, ()))]
        result.sampled = [(s, tokens[s.seq_id]) for s in order if s.seq_id in tokens]

    @torch.inference_mode()
    def forward(
        self,
        out: SchedulerOutput,
        kv: KVCacheManager,
        adapter_slots: dict[str, int] | None = None,
        prompt_lps: dict[int, list[TokenLogprobs]] | None = None,
        nonfinite: set[int] | None = None,
    ) -> tuple[list[Sequence], torch.Tensor | None]:
        """The forward pass alone. Returns the sequences that sample this step and their logits
        (float32 [rows, vocab]), in the same order; a chunk verifying d drafts has 1 + d rows (its
        sequence appears that many times in a row). ``prompt_lps``: where to put the prompt
        logprobs of the prompt positions this step computes, for requests that ask for them.
        ``nonfinite``: gets the seq_ids of sampling rows whose final hidden state holds a NaN or
        an inf (an adapter whose weights overflow the dtype, say): their logits are noise."""
        adapter_slots = adapter_slots or {}
        if out.block_copies:
            self._copy_blocks(out.block_copies)

        def slot_of(chunk: ScheduledChunk) -> int:
            a = chunk.seq.adapter
            return -1 if a is None else adapter_slots[a]

        # One-token chunks (decodes, and 1-token prefill tails) use the decode kernel; the rest use
        # prefill. Within each half, group by adapter slot so LoRA segments are long.
        decodes = sorted((c for c in out.chunks if c.num_tokens == 1), key=slot_of)
        prefills = sorted((c for c in out.chunks if c.num_tokens > 1), key=slot_of)
        ordered = decodes + prefills

        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        token_lora: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        prompt_rows: list[tuple[Sequence, int, list[int]]] = []  # (seq, first row, the tokens predicted)
        for chunk in ordered:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            end = start + chunk.num_tokens
            drafts = chunk.spec_token_ids
            input_ids.extend(seq.token_ids[start : end - len(drafts)])
            input_ids.extend(drafts)
            positions.extend(range(start, end))
            slots.extend(kv.slots(seq, start, end))
            token_lora.extend([slot_of(chunk)] * chunk.num_tokens)
            if prompt_lps is not None:
                first, targets = _prompt_positions(seq, start, end)
                if targets:
                    prompt_rows.append((seq, len(input_ids) - (end - first), targets))
            if chunk.samples:
                r = 1 + len(drafts)
                sample_rows.extend(range(len(input_ids) - r, len(input_ids)))
                sample_seqs.extend([seq] * r)

        dev = self.device
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(decodes),
            decode_block_tables=self._block_tables([c.seq for c in decodes], kv),
            decode_context_lens=torch.tensor(
                [c.seq.num_computed_tokens + 1 for c in decodes], dtype=torch.int32, device=dev
            ),
            prefill_block_tables=self._block_tables([c.seq for c in prefills], kv),
            prefill_query_start_loc=torch.tensor(
                _cumsum([c.num_tokens for c in prefills]), dtype=torch.int32, device=dev
            ),
            prefill_context_lens=torch.tensor(
                [c.seq.num_computed_tokens + c.num_tokens for c in prefills], dtype=torch.int32, device=dev
            ),
            ops=self.ops,
            lora_segments=make_lora_segments(token_lora, dev) if any(s >= 0 for s in token_lora) else None,
        )
        hidden = self.model(batch, self.kv_caches)
        if prompt_lps is not None:
            for seq, row, targets in prompt_rows:
                k = seq.request.params.prompt_logprobs or 0
                entries = prompt_lps[seq.seq_id] = []
                # A few hundred rows at a time: a long prompt chunk's full logits would be
                # chunk x vocab floats at once (a 2048-token chunk of a 49k vocabulary: 400 MB).
                for j in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
                    part = targets[j : j + PROMPT_LOGPROBS_ROWS]
                    logits = self.model.compute_logits(hidden[row + j : row + j + len(part)])
                    entries.extend(prompt_logprobs(logits, part, k))
        if not sample_rows:
            return [], None
        rows = torch.tensor(sample_rows, dtype=torch.long, device=dev)
        sampled_hidden = hidden.index_select(0, rows)
        if nonfinite is not None:
            # [rows, hidden] is ~85x cheaper to check than [rows, vocab] logits, and a NaN or inf
            # in the logits can only come from one here (the head's weights are finite).
            finite = torch.isfinite(sampled_hidden).all(dim=-1)
            if not bool(finite.all()):
                nonfinite.update(sample_seqs[i].seq_id for i in (~finite).nonzero().flatten().tolist())
        return sample_seqs, self.model.compute_logits(sampled_hidden)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: a block shared by forked sequences is copied before one of them writes."""
        last = {d: s for s, d in copies}  # a block freed and reused as a copy target within one step: last wins
        src = torch.tensor(list(last.values()), dtype=torch.long, device=self.device)
        dst = torch.tensor(list(last.keys()), dtype=torch.long, device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache.index_select(0, src))
            v_cache.index_copy_(0, dst, v_cache.index_select(0, src))

    def _block_tables(self, seqs: list[Sequence], kv: KVCacheManager) -> torch.Tensor:
        tables = [kv.block_table(s) for s in seqs]
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).reshape(len(seqs), width)


def _prompt_positions(seq: Sequence, start: int, end: int) -> tuple[int, list[int]]:
    """The positions of ``[start, end)`` whose prompt logprobs ``seq`` still needs: position p's
    logits predict prompt token p+1. Only the request's first sequence records them (n > 1 shares
    the prompt), and a recomputed prefix (after preemption) is not recorded twice."""
    if seq.request.params.prompt_logprobs is None or seq is not seq.request.sequences[0]:
        return start, []
    first = max(start, len(seq.prompt_logprobs))
    last = min(end, seq.num_prompt_tokens - 1)
    return first, seq.token_ids[first + 1 : last + 1] if first < last else []


def _cumsum(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out
