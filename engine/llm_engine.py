"""LLMEngine: the synchronous core — add requests, call ``step()``, read outputs.

One step is the shape of vLLM v1's, each part owned by one component:
  spec.propose(running)           -> drafts in ``spec_token_ids`` (speculative decoding only)
  scheduler.schedule()            -> the plan (who runs, how many tokens and drafts, blocks, adapters)
  runner.execute(plan)            -> a RunnerOutput: forward, sampling (grammar masks, n > 1 forks),
                                     draft verification — tokens, logprobs, accepted-draft counts
  scheduler.update_from_output()  -> tokens booked, forks, token-level stops, policy accounting
  output_processor                -> text, stop strings, the outputs callers receive
``LLM`` and ``AsyncEngine`` both drive this; a simulation drives the scheduler alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .compile_billing import CompileBilling
from .config import EngineConfig
from .errors import InvalidRequestError
from .input_processor import InputProcessor
from .kv_cache import KVCacheManager, default_num_kv_blocks
from .lora import LoRAManager
from .model_runner import ModelRunner
from .models import ModelConfig
from .output_processor import OutputProcessor
from .outputs import FinishReason, RequestOutput
from .policies import make_policy
from .request import EngineRequest
from .runner_output import RunnerOutput
from .sampler import advance_seeded_generator
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .scheduler_output import SchedulerOutput
from .sequence import AdapterRef, GroupInfo, Request, Sequence, TenantInfo
from .spec_decode import SpeculativeDecoder
from .structured_output import StructuredOutputManager
from .tokenizer import load_tokenizer

log = logging.getLogger("loraplex.engine")

MAX_DEFAULT_MODEL_LEN = 8192
UNCHANGED: Any = object()  # set_tenant: leave this field as it is (None means "no per-tenant limit")
STEP_PHASES = ("schedule", "forward", "sample", "update")  # forward and sample are timed by the runner


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
        cache = config.cache_config
        num_blocks = cache.num_kv_blocks or default_num_kv_blocks(config, mc, dtype, self.max_model_len)
        self.kv = KVCacheManager(
            num_blocks, cache.block_size, cache.watermark, enable_prefix_caching=cache.enable_prefix_caching
        )
        if config.max_model_len is None and self.kv.max_tokens_per_sequence < self.max_model_len:
            # The default context must fit one sequence in the cache: chat's default max_tokens is
            # "what is left of the context", which a small cache would otherwise refuse with a 400.
            # A max_model_len the operator set is kept (requests over the cache are refused).
            held = self.kv.max_tokens_per_sequence
            log.info("max_model_len %d -> %d: the KV cache holds %d tokens", self.max_model_len, held, held)
            self.max_model_len = held
        eos = set(mc.eos_token_ids)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.limits = config.request_limits
        self.structured = StructuredOutputManager(
            self.tokenizer,
            mc.vocab_size,
            self.eos_token_ids,
            max_spec_bytes=self.limits.max_structured_spec_bytes,
            per_tenant=self.limits.structured_compile_per_tenant,
            timeout_s=self.limits.structured_compile_timeout_s,
        )
        self.runner = ModelRunner(
            config,
            mc,
            self.max_model_len,
            num_blocks,
            kv=self.kv,
            structured=self.structured,
            eos_token_ids=self.eos_token_ids,
        )
        # Device slots are allocated on the first add_adapter (base-only serving pays nothing).
        self.lora = LoRAManager(config, mc, self.runner.model, kernels=self.runner.ops.name)
        # After the runner and the LoRA manager: a draft that is the target shares its module and
        # slots, another shape-compatible draft gets the slot writes mirrored.
        self.spec = (
            SpeculativeDecoder(
                config,
                mc,
                self.kv,
                self.max_model_len,
                self.eos_token_ids,
                target_model=self.runner.model,
                lora=self.lora,
                structured=self.structured,
            )
            if config.speculative_method
            else None
        )
        self.runner.spec = self.spec
        sched_config = config.scheduler_config
        self.policy = make_policy(sched_config)
        self.scheduler = Scheduler(
            sched_config, self.kv, self.policy, max_model_len=self.max_model_len, eos_token_ids=self.eos_token_ids
        )
        self.policy.resident_adapters_fn = self.lora.resident_adapters
        self.billing = CompileBilling(
            self.structured, self.policy, self.limits.structured_compile_tokens_per_s, config.vtc_output_weight
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        assert config.max_num_seqs is not None  # sized at construction
        self.inputs = InputProcessor(
            self.tokenizer,
            vocab_size=mc.vocab_size,
            max_model_len=self.max_model_len,
            max_num_seqs=config.max_num_seqs,
            limits=self.limits,
            kv=self.kv,
            structured=self.structured,
            adapter_ref=self.lora.ref,
        )
        self.requests: dict[str, Request] = {}
        self.tenants: dict[str, TenantInfo] = {}
        self.groups: dict[tuple[str, str], GroupInfo] = {}  # (tenant, fair group key): nested fairness
        self.counters = {
            "requests": 0,
            "finished": 0,
            "aborted": 0,
            "errors": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "preemptions": 0,
            "steps": 0,
        }
        self._step_seconds = dict.fromkeys(("schedule", "update"), 0.0)  # cumulative, the runner keeps its own

    # ------------------------------------------------------------------ requests in
    def validate(self, request: EngineRequest) -> tuple[list[int], AdapterRef | None]:
        """Everything that can be refused before the request is queued (``InputProcessor``); the
        server calls it on its own thread."""
        return self.inputs.process(request)

    def add_request(
        self, request: EngineRequest | str | list[int], params: SamplingParams | None = None, **fields: Any
    ) -> Request:
        """Queue a request. Takes an ``EngineRequest``, or its fields (``add_request(prompt, params,
        adapter=..., tenant_id=...)``)."""
        if not isinstance(request, EngineRequest):
            request = EngineRequest(request, params or SamplingParams(), **fields)
        elif params is not None or fields:
            raise TypeError("pass either an EngineRequest or its fields, not both")
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use", param="request_id")
        token_ids, adapter = self.validate(request)
        tenant = self.tenants.get(request.tenant_id) or self.set_tenant(request.tenant_id)
        params = request.params
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=token_ids,
            params=params,
            adapter=adapter,
            tenant=tenant,
            cache_salt=request.cache_salt,
            arrival_time=request.arrival_time if request.arrival_time is not None else time.monotonic(),
            group=self._group(request),
        )
        resume = list(request.resume_token_ids)
        for i in range(params.n):
            seq = Sequence(request=req, index=i, token_ids=token_ids + resume, num_prompt_tokens=len(token_ids))
            if params.seed is not None:
                seq.generator = torch.Generator(device=self.device).manual_seed(params.seed + i)
                if not params.greedy:
                    advance_seeded_generator(seq.generator, len(resume))
            if params.logprobs is not None:  # keeps seq.logprobs aligned with the output tokens
                seq.logprobs = [None] * len(resume)
            req.sequences.append(seq)
        if params.structured_output is not None:
            self.structured.add_sequences(req.sequences, request.grammar)
            for t in resume:  # the grammar continues where the resumed output left it
                self.structured.accept(req.sequences[0], t)
        self.requests[req.request_id] = req
        self.output_processor.add(req, request.output_kind)
        # n > 1: sample 0 prefills the prompt once; the others fork from it (copy-on-write).
        self.scheduler.add_forked(req.sequences[0], req.sequences[1:])
        if adapter is not None:
            self.lora.on_request_added(adapter.name)
        self.counters["requests"] += 1
        self.billing.settle(self.tenants, lambda: {r.tenant.tenant_id for r in self.requests.values()})
        return req

    def set_tenant(
        self,
        tenant_id: str,
        priority: int | None = None,
        weight: float | None = None,
        max_running_seqs: int | None = UNCHANGED,
    ) -> TenantInfo:
        """Create or update a tenant's scheduling fields — the only writer of them. Requests hold
        the same TenantInfo object, so a change reaches queued and running requests at the next step."""
        if weight is not None and (not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0):
            raise InvalidRequestError(f"weight must be > 0, got {weight!r}", param="weight")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise InvalidRequestError(f"priority must be an integer, got {priority!r}", param="priority")
        if (
            max_running_seqs is not UNCHANGED
            and max_running_seqs is not None
            and (not isinstance(max_running_seqs, int) or isinstance(max_running_seqs, bool) or max_running_seqs < 1)
        ):
            raise InvalidRequestError(
                f"max_running_seqs must be a positive integer or None, got {max_running_seqs!r}",
                param="max_running_seqs",
            )
        tenant = self.tenants.get(tenant_id)
        if tenant is None:
            tenant = self.tenants[tenant_id] = TenantInfo(tenant_id)
        if priority is not None:
            tenant.priority = priority
        if weight is not None:
            tenant.weight = float(weight)
        if max_running_seqs is not UNCHANGED:
            tenant.max_running_seqs = max_running_seqs  # None: back to the engine-wide default
        return tenant

    def _group(self, request: EngineRequest) -> GroupInfo | None:
        """The tenant's fair group of this request, shared by its requests and updated from the
        newest one (a group's weight or priority change reaches its queued requests at once)."""
        fg = request.fair_group
        if fg is None:
            return None
        key = (request.tenant_id, fg.key)
        info = self.groups.get(key)
        if info is None:
            info = self.groups[key] = GroupInfo(fg.key)
        info.priority, info.weight = fg.priority, float(fg.weight)
        return info

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        for seq in req.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ABORT)
        self.counters["aborted"] += 1
        return self._finish_request(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        with self._timed("schedule"):
            if self.spec is not None:
                self.spec.propose(self.scheduler.running, self.lora.resident_slots())
            plan = self.scheduler.schedule()
        self.counters["preemptions"] += len(plan.preempted)
        if not plan:
            return self._fail_stuck_head() if self.scheduler.is_stuck() else []
        self.counters["steps"] += 1
        try:
            result = self.runner.execute(plan, self.lora.prepare(plan.adapters))
        except Exception as exc:  # a bad step must not take the engine down with it
            log.exception("engine step failed")
            return self._fail_step(plan, exc)
        with self._timed("update"):
            # before booking: a failed request's sequences are finished, so their noise tokens
            # are never appended, and their blocks never reach the prefix cache
            failed = self._fail_nonfinite(result) if result.nonfinite else []
            touched = self.scheduler.update_from_output(plan, result)
            for seq, stop, cut in self.output_processor.process_tokens(touched):
                if cut and seq.is_finished:  # a length/EOS finish at a later, now dropped token
                    seq.finish_reason, seq.stop_reason = FinishReason.STOP, stop
                self.scheduler.finish(seq, FinishReason.STOP, stop)
            self.counters["generated_tokens"] += result.num_tokens
            return failed + self._outputs_for(touched)

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._step_seconds[phase] += time.perf_counter() - t0

    @property
    def step_seconds(self) -> dict[str, float]:
        """Cumulative seconds per step phase (``STEP_PHASES``)."""
        return {**self._step_seconds, **self.runner.seconds}

    def _outputs_for(self, touched: list[Sequence]) -> list[RequestOutput]:
        now = time.monotonic()
        results = []
        for req in dict.fromkeys(seq.request for seq in touched):
            if req.first_token_time is None:
                req.first_token_time = now
            if req.finished:
                results.append(self._finish_request(req))
            else:
                out = self.output_processor.make_output(req)
                if out is not None:
                    results.append(out)
        return results

    def _finish_request(self, req: Request) -> RequestOutput:
        req.finish_time = time.monotonic()
        self.requests.pop(req.request_id, None)
        self.counters["finished"] += 1
        self.counters["prompt_tokens"] += len(req.prompt_token_ids)
        if req.adapter is not None:
            self.lora.on_request_finished(req.adapter.name)
        for seq in req.sequences:
            self.structured.release(seq)
        return self.output_processor.finish(req)

    def _fail_requests(self, reqs: list[Request], error: str) -> list[RequestOutput]:
        results = []
        for req in reqs:
            req.error = error
            for seq in req.sequences:
                if not seq.is_finished:
                    self.scheduler.finish(seq, FinishReason.ERROR)
            self.counters["errors"] += 1
            results.append(self._finish_request(req))
        return results

    def _fail_nonfinite(self, result: RunnerOutput) -> list[RequestOutput]:
        """Fail the requests whose sampled rows were NaN / inf this step (their tokens are noise;
        the rows beside them are unaffected): a clear error instead of token 0 with logprob NaN."""
        failed = []
        for req in dict.fromkeys(seq.request for seq, _ in result.sampled if seq.seq_id in result.nonfinite):
            hint = (
                ""
                if req.adapter is None
                else f" (adapter {req.adapter.name!r}: its weights may overflow the model's dtype)"
            )
            log.error("request %s: non-finite model output%s", req.request_id, hint)
            failed += self._fail_requests(
                [req], "the model's output for this request was not finite (NaN or inf)" + hint
            )
        return failed

    def _fail_step(self, plan: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        failed = list(dict.fromkeys(c.seq.request for c in plan.chunks))
        return self._fail_requests(failed, f"{type(exc).__name__}: {exc}")

    def _fail_stuck_head(self) -> list[RequestOutput]:
        """Nothing runs and nothing can be admitted: fail the head request rather than hang."""
        seq = self.policy.next_waiting(set(), time.monotonic())
        if seq is None:
            return []
        log.error("failing unschedulable request %s", seq.request.request_id)
        return self._fail_requests(
            [seq.request], "request could not be scheduled (not enough KV cache or adapter slots)"
        )

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        return {
            "scheduler": self.scheduler.stats(),
            "kv_cache": self.kv.stats(),
            "counters": dict(self.counters),
            "step_seconds": dict(self.step_seconds),
            "structured_output": dict(self.structured.stats),
            "lora": self.lora.stats(),
            "speculative": self.spec.stats() if self.spec is not None else None,
            "max_model_len": self.max_model_len,
        }
