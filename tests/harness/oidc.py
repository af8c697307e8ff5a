"""A real OpenID Connect provider for tests: ``oidc-provider-mock`` (authlib's authorization server
on Flask) served by werkzeug in a thread on a free loopback port.

``OIDCProvider(users={"sub": {"email": ..., "groups": [...]}})`` starts it; ``.issuer`` is its URL
(discovery at ``<issuer>/.well-known/openid-configuration``); ``stop()`` or the end of a ``with``
stops it. Any client id and secret are accepted (no registration needed).

The mock checks nonces and codes but not PKCE (it keeps no code challenge), and a real provider
(Keycloak, Okta, Entra ID) does: ``PKCEEnforcer`` wraps its WSGI app to do what RFC 7636 asks of
the provider — remember the ``code_challenge`` (S256) of each issued code, and refuse a token
request whose ``code_verifier`` does not hash to it (400 invalid_grant) — so a test can see a wrong
verifier refused by the provider itself."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit


class PKCEEnforcer:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.challenges: dict[str, str] = {}  # issued code -> its S256 challenge
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Any) -> Any:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if path.endswith("/oauth2/token") and method == "POST":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(size)
            environ["wsgi.input"] = io.BytesIO(body)
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            with self._lock:
                challenge = self.challenges.pop(form.get("code", ""), None)
            if challenge is not None and _s256(form.get("code_verifier", "")) != challenge:
                payload = json.dumps({"error": "invalid_grant", "error_description": "PKCE verification failed"})
                start_response("400 Bad Request", [("Content-Type", "application/json")])
                return [payload.encode()]
            return self.app(environ, start_response)
        if path.endswith("/oauth2/authorize") and method == "POST":
            query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}

            def remember(status: str, headers: list, exc_info: Any = None) -> Any:
                location = dict((k.lower(), v) for k, v in headers).get("location", "")
                code = parse_qs(urlsplit(location).query).get("code", [""])[0]
                if code and query.get("code_challenge_method") == "S256" and query.get("code_challenge"):
                    with self._lock:
                        self.challenges[code] = query["code_challenge"]
                return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

            return self.app(environ, remember)
        return self.app(environ, start_response)


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class OIDCProvider:
    def __init__(self, users: dict[str, dict[str, Any]], *, require_nonce: bool = True) -> None:
        import oidc_provider_mock
        import werkzeug.serving

        app = oidc_provider_mock.app(
            require_nonce=require_nonce,
            user_claims=[oidc_provider_mock.User(sub=sub, claims=claims) for sub, claims in users.items()],
        )
        self._server = werkzeug.serving.make_server("127.0.0.1", 0, PKCEEnforcer(app), threaded=True)
        self.port: int = self._server.server_port
        self.issuer = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="oidc-mock", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> OIDCProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
