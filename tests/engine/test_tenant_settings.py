"""Tenant scheduling fields live on one shared object per tenant, changeable at run time."""

from __future__ import annotations

import pytest

from loraplex.engine import LLM, InvalidRequestError, SamplingParams


def test_set_tenant_updates_queued_requests_and_clears_caps(tiny_llama):
    llm = LLM(model=tiny_llama, num_kv_blocks=64, block_size=8)
    eng = llm.engine
    eng.set_tenant("acme", priority=2, weight=1.0)
    req = eng.add_request([5, 6, 7], SamplingParams(max_tokens=2), tenant_id="acme")  # carries the id only
    assert req.tenant.priority == 2
    eng.set_tenant("acme", priority=0, weight=3.0, max_running_seqs=2)
    # the queued request sees the change at once: the scheduler reads the same object
    assert req.tenant.priority == 0 and req.tenant.weight == 3.0 and req.tenant.max_running_seqs == 2
    eng.set_tenant("acme", weight=2.0)  # fields not named stay as they are
    assert req.tenant.max_running_seqs == 2 and req.tenant.priority == 0
    eng.set_tenant("acme", max_running_seqs=None)  # None removes the tenant's own cap
    assert req.tenant.max_running_seqs is None
    with pytest.raises(InvalidRequestError):
        eng.set_tenant("acme", weight=0)
    with pytest.raises(InvalidRequestError):
        eng.set_tenant("acme", max_running_seqs=0)
    while eng.has_unfinished_requests():
        eng.step()


def test_requests_cannot_write_tenant_fields(tiny_llama):
    """One writer per fact: a request names its tenant; priority/weight come from set_tenant only."""
    eng = LLM(model=tiny_llama, num_kv_blocks=64, block_size=8).engine
    eng.set_tenant("acme", priority=1, weight=4.0)
    with pytest.raises(TypeError):
        eng.add_request([5, 6, 7], SamplingParams(max_tokens=2), tenant_id="acme", weight=1.0)
    req = eng.add_request([5, 6, 7], SamplingParams(max_tokens=2), tenant_id="acme")
    assert (req.tenant.priority, req.tenant.weight) == (1, 4.0)
    unknown = eng.add_request([5, 6], SamplingParams(max_tokens=2), tenant_id="new")
    assert (unknown.tenant.priority, unknown.tenant.weight) == (0, 1.0)  # engine defaults until pushed
    while eng.has_unfinished_requests():
        eng.step()
