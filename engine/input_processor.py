"""InputProcessor: every check a request passes before it is queued, in one place.

vLLM v1 has its ``Processor`` in front of the engine core; here it is the same idea. Sampling values
and their per-request bounds, ``n`` against the batch, the prompt (text or token ids), the context
length and the KV capacity, resumed tokens, ``logit_bias`` ids against the vocabulary, the grammar
(compiled here, so the engine thread never compiles) and the adapter name. It reads only facts that
do not change while the engine runs (the adapter registry is re-checked when the request is
queued), so the server calls it on its own thread (``AsyncEngine.submit``) and a bad request is
refused there, never inside a step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import RequestLimits
from .errors import InvalidRequestError
from .kv_cache import KVCacheManager
from .request import EngineRequest
from .sampling_params import SamplingParams, check_request_limits
from .sequence import AdapterRef
from .structured_output import StructuredOutputManager


def _is_token_id(t: object, vocab: int) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab


class InputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        max_model_len: int,
        max_num_seqs: int,
        limits: RequestLimits,
        kv: KVCacheManager,
        structured: StructuredOutputManager,
        adapter_ref: Callable[[str], AdapterRef],
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.limits = limits
        self.kv = kv
        self.structured = structured
        self.adapter_ref = adapter_ref  # raises UnknownAdapterError for a name not registered

    def process(self, request: EngineRequest) -> tuple[list[int], AdapterRef | None]:
        """The prompt's token ids and the adapter's identity; raises ``InvalidRequestError`` (or
        ``UnknownAdapterError``) naming the offending field."""
        params = request.params
        params.validate()
        check_request_limits(params, self.limits)
        if params.n > self.max_num_seqs:
            raise InvalidRequestError(
                f"n = {params.n} samples cannot run together: the batch holds at most "
                f"max_num_seqs = {self.max_num_seqs} sequences",
                param="n",
            )
        token_ids = self.tokenize(request.prompt)
        self._check_fits(token_ids, params)
        self._check_resume(request)
        self._check_vocab(params)
        _check_group(request)
        if params.structured_output is not None and request.grammar is None:
            # A cache hit when the server compiled it first; attached to the request so that
            # add_request on the engine thread never compiles (nor waits on a compilation).
            request.grammar = self.structured.compile(params.structured_output, tenant=request.tenant_id)
        adapter = self.adapter_ref(request.adapter) if request.adapter is not None else None
        return token_ids, adapter

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True) if prompt else []
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            for t in ids:
                if not _is_token_id(t, self.vocab_size):
                    raise InvalidRequestError(
                        f"prompt token ids must be integers in [0, {self.vocab_size}), got {t!r}", param="prompt"
                    )
        else:
            raise InvalidRequestError(
                f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", param="prompt"
            )
        if not ids:
            raise InvalidRequestError("prompt is empty", param="prompt")
        return ids

    def _check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the maximum context length {self.max_model_len}",
                param="max_tokens",
            )
        if not self.kv.can_ever_hold(total):
            raise InvalidRequestError(
                f"prompt + max_tokens = {total} tokens needs {self.kv.blocks_for_tokens(total)} KV blocks but the "
                f"KV cache holds only {self.kv.usable_blocks} usable blocks",
                param="max_tokens",
            )

    def _check_resume(self, request: EngineRequest) -> None:
        resume, params = request.resume_token_ids, request.params
        if not resume:
            return
        if params.n != 1:
            raise InvalidRequestError("resume_token_ids continues one sample: n must be 1", param="resume_token_ids")
        if len(resume) >= params.max_tokens:
            raise InvalidRequestError(
                f"{len(resume)} resumed tokens leave nothing of max_tokens = {params.max_tokens}",
                param="resume_token_ids",
            )
        if any(not _is_token_id(t, self.vocab_size) for t in resume):
            raise InvalidRequestError(
                f"resume_token_ids must be integers in [0, {self.vocab_size})", param="resume_token_ids"
            )

    def _check_vocab(self, params: SamplingParams) -> None:
        bad = [t for t in params.logit_bias if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"logit_bias token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", param="logit_bias"
            )


def _check_group(request: EngineRequest) -> None:
    group = request.fair_group
    if group is None:
        return
    if not isinstance(group.key, str) or not group.key:
        raise InvalidRequestError("fair_group.key must be a non-empty string", param="fair_group")
    if not isinstance(group.priority, int) or isinstance(group.priority, bool):
        raise InvalidRequestError(f"fair_group.priority must be an integer, got {group.priority!r}", param="fair_group")
    w = group.weight
    if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 < w < float("inf"):
        raise InvalidRequestError(f"fair_group.weight must be > 0 and finite, got {w!r}", param="fair_group")
