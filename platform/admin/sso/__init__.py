"""Single sign-on for the admin page: OpenID Connect login (``oidc``), server-side sessions behind
an HttpOnly cookie with CSRF protection (``sessions``), roles as an explicit route allowlist
(``roles``) and the login routes (``routes``). docs/sso.md describes the whole of it."""
