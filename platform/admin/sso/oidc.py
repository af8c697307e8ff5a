"""OpenID Connect authorization code flow with PKCE (authlib), the relying party's side.

Discovery reads ``<issuer>/.well-known/openid-configuration`` once (and the provider's keys, again
when a token names a key we do not have: a key rotation). A sign-in in progress is carried by the
browser in a short-lived cookie signed with the server secret (state, nonce, PKCE verifier, its
own expiry), not in server memory, so any replica of a scale-out can finish it."""

from __future__ import annotations

import base64
import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import OAuth2Client
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry

from loraplex.platform.errors import PlatformError

if TYPE_CHECKING:
    from loraplex.platform.auth.tokens import KeyHasher
    from loraplex.platform.settings import SSOSettings

CALLBACK_PATH = "/admin/sso/callback"


class LoginRefused(PlatformError):
    """The provider's answer does not complete a sign-in (wrong state, nonce, code or token)."""

    status_code = 400
    type = "authentication_error"
    code = "sso_login_failed"


class ProviderUnavailable(PlatformError):
    status_code = 502
    type = "api_error"
    code = "sso_provider_unavailable"


@dataclass(frozen=True)
class PendingLogin:
    state: str
    nonce: str
    code_verifier: str
    expires_at: float

    def seal(self, hasher: KeyHasher) -> str:
        body = base64.urlsafe_b64encode(json.dumps(self.__dict__).encode()).decode()
        return f"{body}.{hasher.hash('sso-login:' + body)}"

    @classmethod
    def unseal(cls, value: str, hasher: KeyHasher, now: float) -> PendingLogin:
        body, _, mac = value.partition(".")
        if not body or not hmac.compare_digest(mac, hasher.hash("sso-login:" + body)):
            raise LoginRefused("no sign-in in progress in this browser (start again from the admin page)")
        try:
            login = cls(**json.loads(base64.urlsafe_b64decode(body)))
        except (ValueError, TypeError):
            raise LoginRefused("no sign-in in progress in this browser") from None
        if login.expires_at < now:
            raise LoginRefused("the sign-in took too long; start again from the admin page")
        return login


class OIDCClient:
    def __init__(self, settings: SSOSettings) -> None:
        self.settings = settings
        self._metadata: dict[str, Any] | None = None
        self._keys: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @property
    def redirect_uri(self) -> str:
        # read at each sign-in, not kept: a server started on port 0 learns its own origin after
        # the client is made (tests/platform/sso_helpers.py)
        return self.settings.base_url.rstrip("/") + CALLBACK_PATH

    def _client(self) -> OAuth2Client:
        s = self.settings
        return OAuth2Client(
            client_id=s.client_id,
            client_secret=s.client_secret or None,
            scope=s.scopes,
            redirect_uri=self.redirect_uri,
            code_challenge_method="S256",
            timeout=s.http_timeout_s,
        )

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            resp = httpx.get(url, timeout=self.settings.http_timeout_s)
            resp.raise_for_status()
            return resp.json()
        except Exception as exc:  # noqa: BLE001 - any transport or HTTP failure: the provider is unusable now
            raise ProviderUnavailable(f"the identity provider did not answer ({type(exc).__name__})") from None

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is None:
                url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
                meta = self._get_json(url)
                # OIDC Discovery 4.3: the document must name the very issuer we asked (no mix-up).
                if meta.get("issuer", "").rstrip("/") != self.settings.issuer.rstrip("/"):
                    raise ProviderUnavailable("the provider's discovery document names another issuer")
                self._metadata = meta
            return self._metadata

    def _key_set(self, refresh: bool = False) -> KeySet:
        if self._keys is None or refresh:
            self._keys = self._get_json(self.metadata()["jwks_uri"])
        return KeySet.import_key_set(self._keys)  # type: ignore[arg-type]

    def begin(self, now: float) -> tuple[str, PendingLogin]:
        """The provider's authorization URL and the login to remember in the browser."""
        login = PendingLogin(
            state=generate_token(32),
            nonce=generate_token(32),
            code_verifier=generate_token(64),
            expires_at=now + self.settings.login_timeout_s,
        )
        with self._client() as http:
            url, _ = http.create_authorization_url(
                self.metadata()["authorization_endpoint"],
                state=login.state,
                nonce=login.nonce,
                code_verifier=login.code_verifier,
            )
        return url, login

    def finish(self, login: PendingLogin, state: str, code: str) -> dict[str, Any]:
        """Exchange the code (with the PKCE verifier) and return the validated ID token's claims."""
        if not state or not hmac.compare_digest(state, login.state):
            raise LoginRefused("the sign-in's state does not match this browser's (a forged or stale callback)")
        meta = self.metadata()
        try:
            with self._client() as http:
                token = http.fetch_token(
                    meta["token_endpoint"],
                    code=code,
                    code_verifier=login.code_verifier,
                    grant_type="authorization_code",
                )
        except Exception as exc:  # noqa: BLE001 - the provider refused the code (wrong verifier, reused, expired)
            raise LoginRefused(f"the identity provider refused the code: {str(exc)[:200]}") from None
        if "id_token" not in token:
            raise LoginRefused("the identity provider sent no ID token (is 'openid' in sso.scopes?)")
        return self._validate(token, login.nonce)

    def _validate(self, token: dict[str, Any], nonce: str) -> dict[str, Any]:
        meta = self.metadata()
        registry = JWSRegistry(algorithms=meta.get("id_token_signing_alg_values_supported"), strict_check_header=False)
        try:
            try:
                decoded = jwt.decode(token["id_token"], key=self._key_set(), registry=registry)
            except InvalidKeyIdError:  # the provider rotated its keys
                decoded = jwt.decode(token["id_token"], key=self._key_set(refresh=True), registry=registry)
            claims = CodeIDToken(
                decoded.claims,
                decoded.header,
                {"iss": {"essential": True, "values": [meta["issuer"]]}, "nonce": {"essential": True}},
                {"nonce": nonce, "client_id": self.settings.client_id, "access_token": token.get("access_token")},
            )
            claims.validate(now=int(time.time()), leeway=60)
        except (JoseError, ValueError) as exc:
            raise LoginRefused(f"the ID token is not valid: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - authlib's claim errors (nonce, aud, exp, at_hash)
            raise LoginRefused(f"the ID token is not valid: {getattr(exc, 'description', exc)}") from None
        return dict(claims)
