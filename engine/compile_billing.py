"""Grammar compile time charged to the tenant's fair share (issue 32: compiling was unbilled).

The structured-output manager measures each compilation's wall time per tenant; the engine settles
it here, on its own thread, as ``structured_compile_tokens_per_s`` output tokens per second (so at
``vtc_output_weight`` each, divided by the tenant's weight, like generated tokens): a tenant that
makes the server compile waits afterwards as if it had made it generate that much.

A tenant is charged only while it has a request in the engine. Charged while idle, the charge would
be wiped out when it returns (VTC lifts a returning tenant to the backlog's smallest counter); so
its charge waits for its next request, which is normally the one the grammar was compiled for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .policies.base import SchedulingPolicy
from .sequence import TenantInfo
from .structured_output import StructuredOutputManager


class CompileBilling:
    def __init__(
        self, structured: StructuredOutputManager, policy: SchedulingPolicy, tokens_per_s: float, output_weight: float
    ) -> None:
        self._structured = structured
        self._policy = policy
        self._rate = tokens_per_s * output_weight  # service units per second of compilation
        self._unpaid: dict[str, float] = {}  # tenant -> compile seconds not yet charged

    def settle(self, tenants: Mapping[str, TenantInfo], present: Callable[[], set[str]]) -> None:
        """Charge what compiled since the last call, for the tenants in ``present()`` (those with a
        request in the engine); keep the rest for later. Call on the engine thread."""
        for tid, seconds in self._structured.take_charges().items():
            self._unpaid[tid] = self._unpaid.get(tid, 0.0) + seconds
        if not self._unpaid or self._rate <= 0:
            return
        here = present()
        service = {}
        for tid in [t for t in self._unpaid if t in here and t in tenants]:
            service[tid] = self._unpaid.pop(tid) * self._rate / tenants[tid].weight
        if service:
            self._policy.charge_service(service)
