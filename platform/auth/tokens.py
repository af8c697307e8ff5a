"""API key material: generation and keyed hashing. Keys are never stored in clear."""

from __future__ import annotations

import hashlib
import hmac
import secrets

TENANT_KEY_PREFIX = "lpx-"
ADMIN_KEY_PREFIX = "lpx-admin-"
DISPLAY_PREFIX_LEN = 12


def generate_key(prefix: str = TENANT_KEY_PREFIX) -> str:
    return prefix + secrets.token_urlsafe(32)


def display_prefix(key: str) -> str:
    """What people see in listings to tell keys apart; too short to guess the rest from."""
    return key[:DISPLAY_PREFIX_LEN]


class KeyHasher:
    """HMAC-SHA256 with the server secret: a stolen database alone cannot check key guesses."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("KeyHasher needs a non-empty secret")
        self._secret = secret.encode()

    def hash(self, key: str) -> str:
        return hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()

    def matches(self, key: str, expected_hash: str) -> bool:
        return hmac.compare_digest(self.hash(key), expected_hash)
