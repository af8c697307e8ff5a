"""API fuzzing: schemathesis generates requests from /openapi.json for every admin and tenant
route (bounded examples) against the real app on a real database with the real engine. No answer
is a 5xx, every status is one the route documents, and its content type and body match the
documented schema. The tenant's tpm is tiny, so generated requests that would generate for long
are refused at admission (429) rather than run."""

from __future__ import annotations

import pytest
import schemathesis
from billing_helpers import H
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from loraplex.platform.app import create_app

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.mark.slow
def test_no_5xx_and_documented_responses(platform):
    c = platform.client
    tid = c.post("/admin/v1/tenants", json={"name": "fuzz"}, headers=H).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    assert c.put(f"/admin/v1/tenants/{tid}/quota", json={"tpm": 64}, headers=H).status_code == 200
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(platform.ctx, owns_engine=False))
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) > 20
    failures: list[str] = []
    for op in operations:
        try:
            _fuzz(op, H if op.path.startswith("/admin") else {"Authorization": f"Bearer {key}"})
        except (Exception, FailureGroup) as exc:  # collect every route's failure, then report them all
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)


def _fuzz(op, headers: dict[str, str]) -> None:
    @given(case=op.as_strategy())
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()
