"""Structured output with xgrammar: compiled grammars cached by spec, one matcher per sequence.

The grammar for a spec is compiled once (``compile``; thread-safe, callers of the same spec wait
on one compilation) and is meant to be compiled BEFORE the request enters the step loop: the
server compiles in a worker thread while the batch keeps stepping, so the request waits and the
batch does not. Each constrained sequence owns a ``GrammarMatcher``; per step the manager fills
one packed bitmask row per constrained sequence, the batched sampler masks those rows only, and
the sampled tokens advance the matchers.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from .errors import BusyError, InvalidRequestError
from .sampler import TokenBitmask
from .sampling_params import StructuredOutputSpec
from .sequence import Sequence

log = logging.getLogger("loraplex.engine.structured")

_XGR_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[07:40:14] /project/cpp/x.cc:94: "


# xgrammar 0.2.9 lets raw control characters (U+0000-U+001F) into strings that carry minLength /
# maxLength, which makes json.loads reject the output; its pattern path excludes them, so such
# strings are rewritten as an equivalent character-class pattern (escape sequences are then not
# generated inside those strings, a narrower but valid language).
_JSON_CHAR = '[^"\\\\\\u0000-\\u001f]'


def _bounded_strings_as_patterns(node: Any) -> Any:
    if isinstance(node, list):
        return [_bounded_strings_as_patterns(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _bounded_strings_as_patterns(v) for k, v in node.items()}
    if (
        out.get("type") == "string"
        and ("maxLength" in out or "minLength" in out)
        and "pattern" not in out
        and "format" not in out
        and "enum" not in out
        and "const" not in out
    ):
        lo, hi = int(out.pop("minLength", 0)), out.pop("maxLength", None)
        out["pattern"] = f"^{_JSON_CHAR}{{{lo},{'' if hi is None else int(hi)}}}$"
    return out


def _structural_tag_fixed(node: Any) -> Any:
    """The same rewrite inside a structural tag: every ``json_schema`` format's schema."""
    if isinstance(node, list):
        return [_structural_tag_fixed(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _structural_tag_fixed(v) for k, v in node.items() if k != "json_schema"}
    if "json_schema" in node:
        out["json_schema"] = _bounded_strings_as_patterns(node["json_schema"])
    return out


def _param(spec: StructuredOutputSpec) -> str:
    """The request field an error about ``spec`` names: a structural tag is what the platform
    builds from a request's tools (their parameters schemas, the answer's schema beside them)."""
    return "tools" if spec.kind == "structural_tag" else "response_format"


def _lower_priority() -> None:
    """Compilation threads run at a lower CPU priority (Linux: ``nice`` is per thread, and threads
    xgrammar starts from here inherit it): a tenant's grammar must not take the cores the engine
    thread needs to step everyone's batch."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not permitted: run at the normal priority
        pass


class StructuredOutputManager:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        cache_size: int = 256,
        compile_threads: int = 2,
        cache_max_bytes: int = 512 * 1024 * 1024,
        max_spec_bytes: int = 128 * 1024,
        per_tenant: int = 1,
        timeout_s: float = 20.0,
        pool_threads: int = 2,
    ):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._cache_size = cache_size
        # Bounded by bytes too: one big enum schema compiles to hundreds of MB (xgrammar's own
        # memory_size_bytes), so a count alone lets a few dozen such requests fill the machine.
        self._cache_max_bytes = cache_max_bytes
        self._cache_bytes = 0
        self._sizes: dict[StructuredOutputSpec, int] = {}
        self._max_spec_bytes = max_spec_bytes
        self._compile_threads = compile_threads  # xgrammar's own threads per compilation
        self._compiler: Any = None  # built on first use: engines that never constrain pay nothing
        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)  # a tenant's compilation ended
        self._per_tenant = per_tenant
        self._timeout_s = timeout_s
        self._pool_threads = pool_threads  # compilations at once, all tenants together
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[str, int] = {}  # tenant -> its compilations running
        self._charges: dict[str, float] = {}  # tenant -> compile seconds not yet charged
        self._cache: OrderedDict[StructuredOutputSpec, Future] = OrderedDict()
        self._matchers: dict[int, Any] = {}  # seq_id -> xgrammar.GrammarMatcher
        self._bitmask: torch.Tensor | None = None
        self.stats = {"compiled": 0, "cache_hits": 0, "errors": 0}

    # ------------------------------------------------------------------ compilation (any thread)
    def compile(self, spec: StructuredOutputSpec, tenant: str | None = None) -> Any:
        """The compiled grammar of ``spec`` (cached). Raises InvalidRequestError naming what
        xgrammar cannot handle, BusyError when ``tenant`` already has its share of compilations
        running (or this one outlasts the timeout: it goes on, and a retry may find it cached).

        The compilation runs in this manager's pool, never on the caller's thread: the caller
        waits at most the timeout, the engine thread never compiles (it takes the grammar that
        ``LLMEngine.validate`` attached to the request). Its wall time is charged to ``tenant``
        (``take_charges``)."""
        if len(spec.value) > self._max_spec_bytes:
            raise InvalidRequestError(
                f"the {spec.kind.replace('_', ' ')} is {len(spec.value)} characters, more than the limit of "
                f"{self._max_spec_bytes}",
                param=_param(spec),
            )
        deadline = time.monotonic() + self._timeout_s
        with self._slots:
            fut = self._cache.get(spec)
            while fut is None and tenant is not None and self._inflight.get(tenant, 0) >= self._per_tenant:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BusyError(
                        f"this tenant already has {self._per_tenant} grammar compilation(s) running; "
                        "retry when they finish",
                        param=_param(spec),
                        retry_after_s=1.0,
                    )
                self._slots.wait(left)
                fut = self._cache.get(spec)  # compiled by someone else meanwhile?
            if fut is not None:
                self._cache.move_to_end(spec)
                self.stats["cache_hits"] += 1
            else:
                fut = Future()
                self._cache[spec] = fut
                self._evict(keep=spec)
                if tenant is not None:
                    self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
                self._get_pool().submit(self._compile_job, spec, fut, tenant)
        try:
            return fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise BusyError(
                f"compiling the {spec.kind.replace('_', ' ')} took longer than {self._timeout_s:g} s; it goes on "
                "(charged to this tenant) and a retry may find it compiled",
                param=_param(spec),
                retry_after_s=self._timeout_s,
            ) from None

    def _compile_job(self, spec: StructuredOutputSpec, fut: Future, tenant: str | None) -> None:
        t0 = time.perf_counter()
        try:
            grammar = self._compile_now(spec)
            with self._lock:
                if spec in self._cache:
                    self._sizes[spec] = int(getattr(grammar, "memory_size_bytes", 0) or 0)
                    self._cache_bytes += self._sizes[spec]
                    self._evict(keep=spec)
            fut.set_result(grammar)
            self.stats["compiled"] += 1
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            self.stats["errors"] += 1
            with self._lock:
                self._cache.pop(spec, None)  # an error is not cached: the next try says it again
                self._cache_bytes -= self._sizes.pop(spec, 0)
            fut.set_exception(exc)
        finally:
            elapsed = time.perf_counter() - t0
            with self._slots:
                if tenant is not None:
                    self._inflight[tenant] -= 1
                    if not self._inflight[tenant]:
                        del self._inflight[tenant]
                    self._charges[tenant] = self._charges.get(tenant, 0.0) + elapsed
                self._slots.notify_all()

    def take_charges(self) -> dict[str, float]:
        """Seconds of compilation per tenant since the last call (the engine charges them to the
        tenants' fair-share counters)."""
        with self._lock:
            out, self._charges = self._charges, {}
        return out

    def _get_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:  # under the lock (compile's caller holds it)
            self._pool = ThreadPoolExecutor(
                max_workers=self._pool_threads, thread_name_prefix="loraplex-grammar", initializer=_lower_priority
            )
        return self._pool

    def _evict(self, keep: StructuredOutputSpec) -> None:
        """Drop least recently used grammars over the count or byte bound (under the lock); the
        newest stays even alone over the bound (its requests hold it anyway)."""
        while len(self._cache) > 1 and (
            len(self._cache) > self._cache_size or self._cache_bytes > self._cache_max_bytes
        ):
            old = next(iter(self._cache))
            if old == keep:
                self._cache.move_to_end(old)
                old = next(iter(self._cache))
            self._cache.pop(old)
            self._cache_bytes -= self._sizes.pop(old, 0)

    def is_compiled(self, spec: StructuredOutputSpec) -> bool:
        with self._lock:
            fut = self._cache.get(spec)
        return fut is not None and fut.done() and fut.exception() is None

    def _compile_now(self, spec: StructuredOutputSpec) -> Any:
        compiler = self._get_compiler()
        param = _param(spec)
        try:
            if spec.kind == "json_object":  # OpenAI's json_object is an object, not any JSON value
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_schema":
                try:
                    json.loads(spec.value)
                except ValueError as exc:
                    raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}", param=param) from None
                # Compact JSON: a model free to emit whitespace can pad forever before max_tokens.
                schema = _bounded_strings_as_patterns(json.loads(spec.value))
                return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.value)
            if spec.kind == "structural_tag":
                try:
                    tag = json.loads(spec.value)
                except ValueError as exc:
                    raise InvalidRequestError(f"the structural tag is not valid JSON: {exc}", param=param) from None
                return compiler.compile_structural_tag(json.dumps(_structural_tag_fixed(tag)))
            return compiler.compile_grammar(spec.value)
        except InvalidRequestError:
            raise
        except Exception as exc:  # xgrammar reports unsupported constructs as RuntimeError
            msg = _XGR_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
            raise InvalidRequestError(f"unsupported {spec.kind.replace('_', ' ')}: {msg}", param=param) from None

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
                )
                # Our own cache keys by spec; xgrammar's would hold a second copy.
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._compile_threads, cache_enabled=False)
            return self._compiler

    # ------------------------------------------------------------------ per sequence (engine thread)
    @property
    def active(self) -> bool:
        return bool(self._matchers)

    def add_sequences(self, seqs: Seq[Sequence], grammar: Any) -> None:
        import xgrammar as xgr

        for seq in seqs:
            self._matchers[seq.seq_id] = xgr.GrammarMatcher(grammar)

    def bitmask_for(self, seqs: Seq[Sequence]) -> TokenBitmask | None:
        rows = [i for i, s in enumerate(seqs) if s.seq_id in self._matchers]
        if not rows:
            return None
        words = -(-self._vocab_size // 32)
        if self._bitmask is None or self._bitmask.shape[0] < len(rows):
            self._bitmask = torch.empty(max(len(rows), 64), words, dtype=torch.int32)
        bitmask = self._bitmask[: len(rows)]
        for j, i in enumerate(rows):
            self._matchers[seqs[i].seq_id].fill_next_token_bitmask(bitmask, j)
        return TokenBitmask(bitmask, rows)

    def has_matcher(self, seq: Sequence) -> bool:
        return seq.seq_id in self._matchers

    def bitmask_along(self, seq: Sequence, drafts: list[int]) -> tuple[TokenBitmask, int]:
        """Speculation: row j is the mask after ``drafts[:j]``, for the leading ``valid`` drafts the
        grammar accepts (rows 0..valid). Returns (mask, valid); the matcher ends where it began."""
        m = self._matchers[seq.seq_id]
        bitmask = torch.empty(len(drafts) + 1, -(-self._vocab_size // 32), dtype=torch.int32)
        m.fill_next_token_bitmask(bitmask, 0)
        valid = 0
        for token in drafts:
            if m.is_terminated() or not m.accept_token(token):
                break
            valid += 1
            if m.is_terminated():  # a stop token: nothing is sampled after it (verify cuts the run there)
                bitmask[valid].fill_(-1)
                break
            m.fill_next_token_bitmask(bitmask, valid)
        if valid:
            m.rollback(valid)
        return TokenBitmask(bitmask[: valid + 1], list(range(valid + 1))), valid

    def accept(self, seq: Sequence, token: int) -> bool:
        """Advance ``seq``'s matcher; True when the grammar is complete (the sequence should stop)."""
        m = self._matchers.get(seq.seq_id)
        if m is None:
            return False
        if not m.accept_token(token):  # cannot happen for a masked draw; say so rather than drift
            log.error("sequence %s sampled token %d its grammar refuses", seq.seq_id, token)
            return True
        return bool(m.is_terminated())

    def release(self, seq: Sequence) -> None:
        self._matchers.pop(seq.seq_id, None)
