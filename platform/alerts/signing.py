"""Standard Webhooks signatures (https://www.standardwebhooks.com, the scheme Svix and Stripe-like
senders use): ``webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``.

A secret written as ``whsec_<base64>`` is the base64 key (the spec's form, so the
``standardwebhooks`` libraries verify our deliveries as they are); any other secret is used as its
UTF-8 bytes."""

from __future__ import annotations

import base64
import hashlib
import hmac


def key_of(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :])
    return secret.encode()


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    mac = hmac.new(key_of(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(secret: str, msg_id: str, timestamp: str, body: str, signature_header: str) -> bool:
    """True if any ``v1,`` signature in the (space-separated) header matches."""
    expected = sign(secret, msg_id, int(timestamp), body).split(",", 1)[1]
    for part in signature_header.split():
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False
