"""LLMEngine: the synchronous core — add requests, call ``step()``, read outputs.

One step = schedule -> (load adapters) -> run the model on one flattened batch -> sample ->
append tokens, detect stops, free finished sequences. ``LLM`` and ``AsyncEngine`` both drive this.
"""
from __future__ import annotations

import logging
import time
import uuid

import torch

from .config import EngineConfig
from .detokenizer import DetokState, append_text, find_stop_string
from .errors import InvalidRequestError, UnknownAdapterError
from .kv_cache import KVCacheManager
from .lora import LoRAManager
from .model_runner import ModelRunner, default_num_kv_blocks
from .models import ModelConfig
from .outputs import CompletionOutput, RequestOutput
from .policies import make_policy
from .sampler import SamplerOutput, sample_batch
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .structured_output import StructuredOutputManager
from .sequence import Request, Sequence, SequenceStatus, TenantInfo
from .tokenizer import load_tokenizer

log = logging.getLogger("loraplex.engine")

MAX_DEFAULT_MODEL_LEN = 8192
UNCHANGED = object()  # set_tenant: leave this field as it is (None would mean "no per-tenant limit")


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        mc = self.model_config
        self.max_model_len = config.max_model_len or min(mc.max_position_embeddings, MAX_DEFAULT_MODEL_LEN)
        if mc.sliding_window is not None and self.max_model_len > mc.sliding_window:
            # We do not implement sliding-window attention: within the window it is full attention.
            self.max_model_len = mc.sliding_window
        self.tokenizer = load_tokenizer(config.tokenizer or config.model)
        self.device = config.torch_device
        dtype = config.torch_dtype(mc.checkpoint_dtype)
        num_blocks = config.num_kv_blocks or default_num_kv_blocks(config, mc, dtype, self.max_model_len)
        self.runner = ModelRunner(config, mc, self.max_model_len, num_blocks)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.watermark,
                                 enable_prefix_caching=config.enable_prefix_caching)
        self.policy = make_policy(config)
        self.scheduler = Scheduler(config, self.kv, self.policy)
        # Always present; device slots are allocated on the first add_adapter (base-only pays nothing).
        self.lora = LoRAManager(config, mc, self.runner.model)
        self.requests: dict[str, Request] = {}
        self.tenants: dict[str, TenantInfo] = {}
        self._detok: dict[int, DetokState] = {}
        self._generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.stream_text = False  # AsyncEngine sets it: decode text every step, not only at the end
        self.eos_token_ids = set(mc.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.structured = StructuredOutputManager(self.tokenizer, mc.vocab_size, self.eos_token_ids)
        self.counters = {"requests": 0, "finished": 0, "aborted": 0, "errors": 0,
                         "prompt_tokens": 0, "generated_tokens": 0, "preemptions": 0, "steps": 0}
        # Cumulative wall time of the step's phases (forward includes adapter loading).
        self.step_seconds = {"schedule": 0.0, "forward": 0.0, "sample": 0.0}

    # ------------------------------------------------------------------ requests in
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        adapter: str | None = None,
        tenant_id: str = "default",
        priority: int | None = None,
        weight: float | None = None,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        params = params or SamplingParams()
        params.validate()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
        token_ids = self._tokenize(prompt)
        self._check_fits(token_ids, params)
        if adapter is not None and (self.lora is None or not self.lora.has(adapter)):
            raise UnknownAdapterError(f"unknown adapter {adapter!r}", param="model")
        self._check_vocab(params)
        grammar = self.structured.compile(params.structured_output) if params.structured_output else None
        tenant = self.set_tenant(tenant_id, priority=priority, weight=weight)
        req = Request(
            request_id=request_id, prompt_token_ids=token_ids, params=params, adapter=adapter,
            tenant=tenant, cache_salt=cache_salt,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
        )
        if adapter is not None:  # re-registered content under the same name must not hit old KV
            req.adapter_cache_key = f"{adapter}#{self.lora.info(adapter).sha256}"
        for i in range(params.n):
            seq = Sequence(request=req, index=i, token_ids=list(token_ids), num_prompt_tokens=len(token_ids))
            if params.seed is not None:
                seq.generator = torch.Generator(device=self.device).manual_seed(params.seed + i)
            req.sequences.append(seq)
        if grammar is not None:
            self.structured.add_sequences(req.sequences, grammar)
        self.requests[request_id] = req
        for seq in req.sequences:
            self._detok[seq.seq_id] = DetokState()
        # n > 1: sample 0 prefills the prompt once; the others fork from it (copy-on-write).
        self.scheduler.add_forked(req.sequences[0], req.sequences[1:])
        if self.lora is not None and adapter is not None:
            self.lora.on_request_added(adapter)
        self.counters["requests"] += 1
        return req

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            vocab = self.model_config.vocab_size
            for t in ids:
                if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                    raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab}), got {t!r}", param="prompt")
        else:
            raise InvalidRequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt")
        if not ids:
            raise InvalidRequestError("prompt is empty", param="prompt")
        return ids

    def _check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the maximum context length {self.max_model_len}", param="max_tokens")
        if self.kv.blocks_for_tokens(total) > self.kv.usable_blocks:
            raise InvalidRequestError(
                f"prompt + max_tokens = {total} tokens needs {self.kv.blocks_for_tokens(total)} KV blocks but the "
                f"KV cache holds only {self.kv.usable_blocks} usable blocks", param="max_tokens")

    def _check_vocab(self, params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        bad = [t for t in params.logit_bias if t >= vocab]
        if bad:
            raise InvalidRequestError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {vocab})",
                                      param="logit_bias")

    def set_tenant(self, tenant_id: str, priority: int | None = None, weight: float | None = None,
                   max_running_seqs: int | None | object = UNCHANGED) -> TenantInfo:
        """Create or update a tenant's scheduling fields. Requests hold the same TenantInfo object,
        so a change reaches queued and running requests at the very next step."""
        if weight is not None and (not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0):
            raise InvalidRequestError(f"weight must be > 0, got {weight!r}", param="weight")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise InvalidRequestError(f"priority must be an integer, got {priority!r}", param="priority")
        tenant = self.tenants.get(tenant_id)
        if tenant is None:
            tenant = self.tenants[tenant_id] = TenantInfo(tenant_id)
        if priority is not None:
            tenant.priority = priority
        if weight is not None:
            tenant.weight = float(weight)
        if max_running_seqs is not UNCHANGED:
            if max_running_seqs is not None and (not isinstance(max_running_seqs, int) or max_running_seqs < 1):
                raise InvalidRequestError(f"max_running_seqs must be a positive integer or None, got {max_running_seqs!r}",
                                          param="max_running_seqs")
            tenant.max_running_seqs = max_running_seqs  # None: back to the engine-wide default
        return tenant

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        for seq in req.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        self.counters["aborted"] += 1
        return self._finish_request(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.step_seconds["schedule"] += t1 - t0
        self.counters["preemptions"] += len(out.preempted)
        if not out:
            if self.scheduler.has_work() and not self.scheduler.running:
                return self._fail_stuck_head()
            return []
        self.counters["steps"] += 1
        try:
            adapter_slots = self.lora.prepare(out.adapters) if self.lora is not None else {}
            seqs, logits = self.runner.execute(out, self.kv, adapter_slots)
        except Exception as exc:  # a bad step must not take the engine down with it
            log.exception("engine step failed")
            return self._fail_step(out, exc)
        t2 = time.perf_counter()
        self.step_seconds["forward"] += t2 - t1
        self.scheduler.update(out)
        sampled = self._sample(logits, seqs)
        self.step_seconds["sample"] += time.perf_counter() - t2
        tokens = sampled.tokens
        now = time.monotonic()
        touched: dict[str, Request] = {}
        for i, (seq, token) in enumerate(zip(seqs, tokens)):
            req = seq.request
            touched[req.request_id] = req
            if req.first_token_time is None:
                req.first_token_time = now
            self._append(seq, token, sampled, i)
            self._start_forks(seq, logits[i])
        results = []
        for req in touched.values():
            if req.finished:
                results.append(self._finish_request(req))
            else:
                results.append(self._snapshot(req))
        return results

    def _start_forks(self, leader: Sequence, logits_row: torch.Tensor) -> None:
        """n > 1: once the leader's prompt is computed, the other samples fork from it and draw
        their first tokens from the same logits, each with its own generator (seed + i)."""
        followers = self.scheduler.fork_followers(leader)
        if not followers:
            return
        sampled = self._sample(logits_row.unsqueeze(0).expand(len(followers), -1), followers)
        for j, (child, token) in enumerate(zip(followers, sampled.tokens)):
            self._append(child, token, sampled, j)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        bitmask = self.structured.bitmask_for(seqs) if self.structured.active else None
        return sample_batch(logits, seqs, self._generator, bitmask)

    def _append(self, seq: Sequence, token: int, sampled: SamplerOutput, row: int) -> None:
        seq.token_ids.append(token)
        if sampled.logprobs[row] is not None:
            seq.logprobs.append(sampled.logprobs[row])
        self.counters["generated_tokens"] += 1
        self.policy.on_tokens_generated(seq, 1)
        grammar_done = self.structured.accept(seq, token)
        self._check_stop(seq, token)
        if grammar_done:  # the grammar admits nothing more (e.g. ignore_eos after a complete JSON)
            self.scheduler.finish(seq, "stop")

    def _check_stop(self, seq: Sequence, token: int) -> None:
        p = seq.request.params
        needs_text = self.stream_text or bool(p.stop)
        if needs_text:
            delta = append_text(self.tokenizer, seq, self._detok[seq.seq_id])
            hit = find_stop_string(seq.text, p.stop, len(delta))
            if hit is not None:
                idx, stop = hit
                seq.text = seq.text[: idx + (len(stop) if p.include_stop_str_in_output else 0)]
                self.scheduler.finish(seq, "stop", stop)
                return
        if not p.ignore_eos and token in self.eos_token_ids:
            self.scheduler.finish(seq, "stop", None)
        elif token in p.stop_token_ids:
            self.scheduler.finish(seq, "stop", token)
        elif seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            self.scheduler.finish(seq, "length")

    def _finish_request(self, req: Request) -> RequestOutput:
        req.finish_time = time.monotonic()
        for seq in req.sequences:
            if not (self.stream_text or req.params.stop):
                seq.text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            self._detok.pop(seq.seq_id, None)
            self.structured.release(seq)
        self.requests.pop(req.request_id, None)
        self.counters["finished"] += 1
        self.counters["prompt_tokens"] += len(req.prompt_token_ids)
        if self.lora is not None and req.adapter is not None:
            self.lora.on_request_finished(req.adapter)
        return self._snapshot(req)

    def _snapshot(self, req: Request) -> RequestOutput:
        outputs = [
            CompletionOutput(index=s.index, token_ids=list(s.output_token_ids), text=s.text,
                             finish_reason=s.finish_reason, stop_reason=s.stop_reason,
                             logprobs=list(s.logprobs) if req.params.logprobs is not None else None)
            for s in req.sequences
        ]
        metrics = {"arrival_time": req.arrival_time, "first_token_time": req.first_token_time,
                   "finish_time": req.finish_time,
                   "num_cached_tokens": max((s.num_cached_tokens for s in req.sequences), default=0),
                   "num_preemptions": sum(s.num_preemptions for s in req.sequences)}
        return RequestOutput(request_id=req.request_id, prompt_token_ids=req.prompt_token_ids, outputs=outputs,
                             finished=req.finished, adapter=req.adapter, tenant_id=req.tenant_id,
                             metrics=metrics, error=req.error)

    def _fail_step(self, out, exc: Exception) -> list[RequestOutput]:
        failed = {c.seq.request.request_id: c.seq.request for c in out.chunks}
        results = []
        for req in failed.values():
            req.error = f"{type(exc).__name__}: {exc}"
            for seq in req.sequences:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "error")
            self.counters["errors"] += 1
            results.append(self._finish_request(req))
        return results

    def _fail_stuck_head(self) -> list[RequestOutput]:
        """Nothing runs and nothing can be admitted: fail the head request rather than hang."""
        seq = self.policy.next_waiting(set(), time.monotonic())
        if seq is None:
            return []
        req = seq.request
        req.error = "request could not be scheduled (not enough KV cache or adapter slots)"
        log.error("failing unschedulable request %s", req.request_id)
        for s in req.sequences:
            if not s.is_finished:
                self.scheduler.finish(s, "error")
        self.counters["errors"] += 1
        return [self._finish_request(req)]

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        return {
            "scheduler": self.scheduler.stats(),
            "kv_cache": self.kv.stats(),
            "counters": dict(self.counters),
            "step_seconds": dict(self.step_seconds),
            "structured_output": dict(self.structured.stats),
            "lora": self.lora.stats() if self.lora is not None else None,
            "max_model_len": self.max_model_len,
        }
