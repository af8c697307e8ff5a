"""The image's smoke check (scripts/image.sh), standard library only, run on the host.

1. Waits for the container's /health and /ready (a long deadline: the first start converts nothing
   but compiles the native kernels; a container that exits is seen at once).
2. Reads the demo tenant's key from the container's log (``serve`` prints it once) and sends an
   OpenAI chat completion with it: 200, an assistant message, usage counted.
3. Opens a stream of ``--stream-tokens`` tokens, and after its first chunk sends SIGTERM to the
   container (``podman kill --signal TERM``, what ``podman stop`` / Kubernetes send): the stream
   must still end whole (finish_reason "length", ``[DONE]``), and a new connection is refused.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

PODMAN = ["podman", "--runtime", "runc"]


def podman(*args: str) -> str:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=False).stdout + ""


def running(container: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", container).strip() == "true"


def logs(container: str) -> str:
    out = subprocess.run([*PODMAN, "logs", container], capture_output=True, text=True, check=False)
    return out.stdout + out.stderr


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_ready(base: str, container: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not running(container):
            sys.exit(f"smoke: the container exited before it was ready:\n{logs(container)[-4000:]}")
        if get(base + "/health") == 200 and get(base + "/ready") == 200:
            return
        time.sleep(1)
    sys.exit(f"smoke: not ready after {deadline_s:.0f} s:\n{logs(container)[-4000:]}")


def demo_key(container: str) -> str:
    found = re.search(r"Demo tenant 'demo' created; its API key \(shown once\):\s*\n\s*(\S+)", logs(container))
    if not found:
        sys.exit(f"smoke: no demo key in the log:\n{logs(container)[-4000:]}")
    return found.group(1)


def chat(base: str, key: str, model: str, body: dict) -> http.client.HTTPResponse:
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    payload = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}], **body}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request("POST", "/v1/chat/completions", json.dumps(payload), headers)
    return conn.getresponse()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--container", required=True)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--stream-tokens", type=int, default=48)
    a = ap.parse_args()

    wait_ready(a.url, a.container, a.ready_timeout)
    health = subprocess.run([*PODMAN, "healthcheck", "run", a.container], capture_output=True, text=True)
    print(f"smoke: HEALTHCHECK exit {health.returncode} {health.stdout.strip()}")
    if health.returncode != 0:
        sys.exit("smoke: the image's HEALTHCHECK failed on a ready server")
    key = demo_key(a.container)

    resp = chat(a.url, key, a.model, {"max_tokens": 16, "temperature": 0})
    body = json.loads(resp.read())
    if resp.status != 200:
        sys.exit(f"smoke: chat completion answered {resp.status}: {body}")
    text = body["choices"][0]["message"]["content"]
    print(f"smoke: chat completion {resp.status}: {text!r} usage={body['usage']}")
    if not text or body["usage"]["completion_tokens"] < 1:
        sys.exit("smoke: an empty completion")

    # The drain: SIGTERM while a stream is open. ignore_eos-free: max_tokens with min_tokens makes
    # the length deterministic (the demo model could stop early otherwise).
    n = a.stream_tokens
    resp = chat(a.url, key, a.model, {"max_tokens": n, "min_tokens": n, "temperature": 0, "stream": True})
    if resp.status != 200:
        sys.exit(f"smoke: stream answered {resp.status}: {resp.read()[:500]!r}")
    events, finish, signalled = [], None, False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        events.append(data)
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
        if not signalled:
            kill = subprocess.run([*PODMAN, "kill", "--signal", "TERM", a.container], capture_output=True, text=True)
            if kill.returncode != 0:
                sys.exit(f"smoke: podman kill failed: {kill.stderr}")
            signalled = True
            print(f"smoke: SIGTERM sent after the stream's first chunk ({len(events)} event(s) read)")
    if not events or events[-1] != "[DONE]" or finish != "length":
        sys.exit(f"smoke: the stream was cut by SIGTERM: finish={finish} last={events[-3:]}")
    print(f"smoke: the stream ended whole after SIGTERM: {len(events)} events, finish_reason={finish}, [DONE]")


if __name__ == "__main__":
    main()
