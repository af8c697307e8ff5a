"""A real webhook receiver for the alert tests: ``http.server`` on loopback in a thread. It
verifies every delivery's signature with the docs' snippet (docs/alerts.md, copied here as a
receiver would) and answers what the test scripts: a list of statuses, then 200; or it holds a
request open until released (a server killed mid-delivery)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from harness.live import LiveServer
from harness.net import free_port
from platform_helpers import admin_headers

SECRET = "whsec_" + base64.b64encode(b"alert-tests-signing-key-32-bytes").decode()


def verify(secret: str, headers, body: bytes, tolerance_s: int = 300) -> bool:
    """docs/alerts.md's verification snippet."""
    msg_id, ts, sigs = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    if abs(time.time() - int(ts)) > tolerance_s:
        return False  # too old (or too new): a replay
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(mac).decode()
    return any(v == "v1" and hmac.compare_digest(s, expected) for v, _, s in (p.partition(",") for p in sigs.split()))


class Receiver:
    def __init__(self, secret: str = SECRET) -> None:
        self.secret = secret
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # every request: id, status answered, verified, body
        self.script: list[int] = []  # statuses to answer next (then 200)
        self.hold = threading.Event()  # set: requests are held open until released
        self.release = threading.Event()
        self.arrived = threading.Event()
        self.accept_held = False  # after release, a held request is answered 200 (else dropped)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                entry = {
                    "id": self.headers.get("webhook-id"),
                    "verified": verify(outer.secret, self.headers, body),
                    "body": json.loads(body),
                }
                if outer.hold.is_set():
                    entry["status"] = "held"
                    with outer.lock:
                        outer.requests.append(entry)
                    outer.arrived.set()
                    outer.release.wait(120)
                    if not outer.accept_held:
                        return  # the connection closes without an answer
                    entry["status"] = 200  # accepted: the receiver has it, whatever the sender records
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                with outer.lock:
                    status = outer.script.pop(0) if outer.script else 200
                    entry["status"] = status
                    outer.requests.append(entry)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def accepted_ids(self) -> list[str]:
        """Ids answered 200 (each time: duplicates show)."""
        with self.lock:
            return [r["id"] for r in self.requests if r["status"] == 200]

    def all(self) -> list[dict]:
        with self.lock:
            return list(self.requests)

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def alert_settings(**overrides) -> dict:
    """Fast passes, short leases and backoff for tests; loopback receivers allowed."""
    values = {
        "dispatch_interval_s": 0.2,
        "backoff_base_s": 0.2,
        "backoff_max_s": 1.0,
        "delivery_timeout_s": 5.0,
        "lease_s": 8.0,
        "allowed_hosts": ["127.0.0.1"],
    }
    values.update(overrides)
    return values


def admin(srv: LiveServer) -> httpx.Client:
    """An admin-key client of ``srv``."""
    return httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30)
