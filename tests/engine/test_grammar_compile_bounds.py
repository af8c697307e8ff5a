"""Grammar compilation is bounded per tenant and billed (issue 32 item 3): it runs in the
manager's pool, a tenant has at most ``per_tenant`` compilations running (the next one waits at
most the timeout, then BusyError), other tenants are not held up by it, a compilation that
outlasts its caller's timeout goes on and is cached, its time is charged to the tenant, and the
engine thread never compiles (it takes the grammar ``validate`` attached to the request)."""

from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

from loraplex.engine import EngineConfig, LLMEngine, SamplingParams
from loraplex.engine.errors import BusyError
from loraplex.engine.request import EngineRequest
from loraplex.engine.sampling_params import StructuredOutputSpec
from loraplex.engine.structured_output import StructuredOutputManager

pytestmark = pytest.mark.timeout(300)


def _schema(i: int) -> StructuredOutputSpec:
    return StructuredOutputSpec.json_schema({"type": "object", "properties": {f"k{i}": {"type": "integer"}}})


class GatedManager(StructuredOutputManager):
    """The real manager and compiler; a compilation of a spec listed in ``gated`` waits for
    ``release`` first (so a test holds one "slow" compilation open without timing anything)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.started = threading.Event()
        self.gated: set[str] = set()
        self.compiled_on: list[str] = []

    def _compile_now(self, spec):
        self.compiled_on.append(threading.current_thread().name)
        if spec.key in self.gated:
            self.started.set()
            assert self.release.wait(120)
        return super()._compile_now(spec)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def _manager(tokenizer, **kw) -> GatedManager:
    return GatedManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id or 0], **kw)


def test_a_tenant_at_its_share_waits_then_is_refused_and_others_are_not_held(tokenizer):
    mgr = _manager(tokenizer, per_tenant=1, timeout_s=120)
    mgr.compile(_schema(99))  # the compiler is built (slowly) once, outside what is measured
    mgr.take_charges()
    slow = _schema(0)
    mgr.gated.add(slow.key)
    mgr._timeout_s = 0.5  # a's callers give up soon; the gate holds its compilation open until released
    first: list[object] = []
    t = threading.Thread(target=lambda: first.append(_try(mgr, slow, "a")))
    t.start()
    assert mgr.started.wait(60)
    with pytest.raises(BusyError) as err:  # a's second, distinct schema: its one slot is taken
        mgr.compile(_schema(1), tenant="a")
    assert err.value.param == "response_format"
    t.join(60)
    assert isinstance(first[0], BusyError)  # gave up waiting; the compilation goes on
    mgr._timeout_s = 120
    assert mgr.compile(_schema(2), tenant="b") is not None  # another tenant compiles meanwhile
    assert not mgr.is_compiled(slow)
    mgr.release.set()
    assert mgr.compile(_schema(1), tenant="a") is not None  # waits for a's slot, then compiles
    assert mgr.is_compiled(slow)  # the abandoned compilation finished and is cached
    charges = mgr.take_charges()
    assert set(charges) == {"a", "b"} and all(v > 0 for v in charges.values())
    assert mgr.take_charges() == {}  # drained
    assert all(name.startswith("loraplex-grammar") for name in mgr.compiled_on)


def test_a_cached_grammar_is_not_charged_again_and_shared_across_tenants(tokenizer):
    mgr = _manager(tokenizer)
    spec = _schema(7)
    g = mgr.compile(spec, tenant="a")
    mgr.take_charges()
    assert mgr.compile(spec, tenant="b") is g
    assert mgr.take_charges() == {}


def _try(mgr, spec, tenant):
    try:
        return mgr.compile(spec, tenant=tenant)
    except BusyError as exc:
        return exc


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(
        EngineConfig(
            model=tiny_llama,
            dtype="float32",
            max_num_seqs=8,
            num_kv_blocks=64,
            structured_compile_tokens_per_s=1e6,
        )
    )


def test_engine_thread_takes_the_attached_grammar_and_never_compiles(engine):
    spec = _schema(11)
    req = EngineRequest([1, 2, 3], SamplingParams(max_tokens=4, structured_output=spec), tenant_id="t1")
    engine.validate(req)  # the caller's thread: compiles and attaches
    assert req.grammar is not None
    calls: list[StructuredOutputSpec] = []
    real = engine.structured._compile_now
    engine.structured._compile_now = lambda s: (calls.append(s), real(s))[1]  # counts, still compiles
    try:
        with engine.structured._lock:  # evicted before the engine thread takes it
            engine.structured._cache.clear()
        engine.add_request(req)
    finally:
        del engine.structured._compile_now
    assert calls == []
    while engine.has_unfinished_requests():
        engine.step()


def test_compile_time_is_charged_to_the_tenants_fair_share(engine):
    policy = engine.policy
    before = policy.counters.get("payer", 0.0)
    req = EngineRequest([1, 2, 3], SamplingParams(max_tokens=1, structured_output=_schema(12)), tenant_id="payer")
    free = EngineRequest([1, 2, 3], SamplingParams(max_tokens=1), tenant_id="free")
    engine.add_request(free)  # backlogged first: the payer is lifted to its counter, then charged
    engine.add_request(req)
    # charged at add_request, before either generated anything: compile seconds x 1e6 x weight 2
    assert policy.counters["payer"] - max(before, policy.counters["free"]) > 100
    while engine.has_unfinished_requests():
        engine.step()
