"""First start in demo mode: a ``demo`` tenant and an API key, printed once with snippets that
work as pasted. Later starts find the tenant and print nothing new (only the key's hash is kept)."""

from __future__ import annotations

import sys

from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.keys import service as keys
from loraplex.platform.tenants import repository as tenants_repo
from loraplex.platform.tenants import service as tenants

DEMO_TENANT = "demo"
DEMO_ACTOR = Actor("demo-bootstrap")


def ensure_demo_tenant(ctx) -> str | None:
    """Create the demo tenant and its first key unless the tenant exists; returns the new key."""
    with unit_of_work(ctx.sessions) as session:
        if tenants_repo.get_by_name(session, DEMO_TENANT) is not None:
            return None
        tenant = tenants.create_tenant(session, ctx, DEMO_ACTOR, name=DEMO_TENANT)
        _key, secret = keys.create_key(session, ctx, DEMO_ACTOR, tenant.id, "demo", None)
        return secret


def demo_snippets(base_url: str, api_key: str, model: str) -> str:
    """A curl command and an OpenAI-SDK script that use the demo key against this server."""
    return f"""\
curl {base_url}/v1/chat/completions \\
  -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}], "max_tokens": 32, "temperature": 0}}'

{sys.executable} - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base_url}/v1", api_key="{api_key}")
reply = client.chat.completions.create(
    model="{model}", temperature=0, max_tokens=32,
    messages=[{{"role": "user", "content": "What is the capital of France?"}}])
print(reply.choices[0].message.content)
PY"""
