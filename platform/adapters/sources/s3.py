"""``s3://`` sources: boto3 against AWS or any S3-compatible store (credentials and endpoint from
the standard AWS variables unless ``[adapters]`` names an endpoint).

boto3 signs the requests, retries and parses the answers, but its own HTTP stack reads a response
body with blocking reads that only a per-``recv`` timeout bounds: a store that trickles one byte
every few seconds holds the call forever, and a listing page of gigabytes is read into memory.
So every request is sent through ``BoundedSender`` (botocore's ``before-send`` hook lets a
handler answer in its place): httpx with connect and read timeouts, the body read as it arrives
and abandoned past the fetch's deadline or past a byte cap (an object: its listed size; any other
answer: ``MAX_ANSWER_BYTES``), spooled to a temporary file rather than kept in memory."""

from __future__ import annotations

import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpcore
import httpx

from loraplex.platform.adapters.sources.fetchers import (
    MAX_LISTED,
    FetchDeadline,
    SourceNotFound,
    StoreUnavailable,
    copy_bounded,
)
from loraplex.platform.adapters.sources.uri import RemoteFile, SourceRejected, SourceURI

MAX_ANSWER_BYTES = 8 << 20  # a 1,000-key listing page is ~0.5 MB; an error body a few hundred bytes
SPOOL_IN_MEMORY = 1 << 20


class _Limits(threading.local):
    deadline: float | None = None
    max_bytes: int = MAX_ANSWER_BYTES
    cut: bool = False  # the last read's timeout was the deadline's


class _Body:
    """What botocore reads an answer from (``AWSResponse.raw``): the spooled bytes."""

    def __init__(self, spool: IO[bytes]) -> None:
        self._spool = spool

    def read(self, amt: int | None = None) -> bytes:
        return self._spool.read(-1 if amt is None else amt)

    def stream(self, amt: int = 1 << 16, decode_content: bool = False) -> Iterator[bytes]:
        while chunk := self._spool.read(amt):
            yield chunk

    def close(self) -> None:
        self._spool.close()


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most until the fetch's deadline: a store
    trickling its status line or headers (each byte resets a per-read timeout) is cut there too."""

    def __init__(self, inner: httpcore.NetworkStream, limits: _Limits) -> None:
        self._inner, self._limits = inner, limits

    def _timeout(self, timeout: float | None) -> float | None:
        deadline = self._limits.deadline
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        # a read that times out after this was cut by the deadline, not by the store's read timeout
        self._limits.cut = timeout is None or left <= timeout
        if left <= 0:
            raise httpcore.ReadTimeout("the fetch deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._timeout(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._timeout(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, self._timeout(timeout)), self._limits
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, limits: _Limits) -> None:
        self._inner, self._limits = httpcore.SyncBackend(), limits

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _DeadlineStream(inner, self._limits)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, timeout, socket_options), self._limits)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on a connection pool whose connections honour the fetch's deadline (the
    environment's proxy for the endpoint, if any, as botocore would use it)."""

    def __init__(self, limits: _Limits, endpoint: str, max_connections: int) -> None:
        super().__init__()
        backend = _DeadlineBackend(limits)
        proxy = _env_proxy(endpoint)
        if proxy:
            url = httpx.URL(proxy)
            target = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)
            self._pool = httpcore.HTTPProxy(proxy_url=target, max_connections=max_connections, network_backend=backend)
        else:
            self._pool = httpcore.ConnectionPool(max_connections=max_connections, network_backend=backend)


def _env_proxy(endpoint: str) -> str | None:
    if not endpoint:
        return None
    host = httpx.URL(endpoint).host
    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(httpx.URL(endpoint).scheme)


class BoundedSender:
    """The HTTP of one S3 client: ``before-send`` answers every request itself (see the module)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, endpoint: str = "") -> None:
        self.limits = _Limits()
        self._http = httpx.Client(
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            transport=_DeadlineTransport(self.limits, endpoint, max_connections=32),
            follow_redirects=False,
            trust_env=False,  # the transport picked the endpoint's proxy itself
        )

    @contextmanager
    def bounded(self, deadline: float | None, max_bytes: int = MAX_ANSWER_BYTES) -> Iterator[None]:
        self.limits.deadline, self.limits.max_bytes, self.limits.cut = deadline, max_bytes, False
        try:
            yield
        finally:
            self.limits.deadline, self.limits.max_bytes = None, MAX_ANSWER_BYTES

    def __call__(self, request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

        deadline, cap = self.limits.deadline, self.limits.max_bytes
        body = request.body
        if body is not None and not isinstance(body, bytes | bytearray | str):
            body = body.read()
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        try:
            with self._http.stream(request.method, request.url, headers=dict(request.headers), content=body) as r:
                received, ok = 0, r.status_code < 300
                limit = cap if ok else MAX_ANSWER_BYTES
                for piece in r.iter_raw():  # each piece as it arrives: the deadline is checked between
                    received += len(piece)
                    if received > limit:
                        what = f"the store's answer to {request.method} {r.url.path} is larger than {limit} bytes"
                        raise SourceRejected(what, param="source") if ok else StoreUnavailable(what)
                    if deadline is not None and time.monotonic() > deadline:
                        raise FetchDeadline(f"{r.url.host}: the store did not deliver within the fetch deadline")
                    spool.write(piece)
                status, headers = r.status_code, dict(r.headers)
        except FetchDeadline:
            spool.close()
            raise
        except httpx.TimeoutException as exc:
            spool.close()
            if deadline is not None and (self.limits.cut or time.monotonic() >= deadline):
                raise FetchDeadline(f"{request.url}: the store did not deliver within the fetch deadline") from None
            if isinstance(exc, httpx.ConnectTimeout):
                raise ConnectTimeoutError(endpoint_url=request.url) from None
            raise ReadTimeoutError(endpoint_url=request.url) from None
        except httpx.TransportError as exc:
            spool.close()
            raise EndpointConnectionError(endpoint_url=request.url, error=exc) from None
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return AWSResponse(request.url, status, headers, _Body(spool))

    def close(self) -> None:
        self._http.close()


class S3Fetcher:
    """Short timeouts and few retries, so a store that is down answers within the fetch's wait;
    the whole fetch ends at its deadline whatever the store does."""

    def __init__(self, endpoint_url: str, region: str, connect_timeout_s: float, read_timeout_s: float, attempts: int):
        self._kwargs = dict(endpoint_url=endpoint_url or None, region_name=region or None)
        self._timeouts = (connect_timeout_s, read_timeout_s, attempts)
        self._sender = BoundedSender(connect_timeout_s, read_timeout_s, endpoint_url)
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:  # boto3's client creation is not thread-safe
            if self._client is None:
                import boto3
                from botocore.config import Config

                connect, read, attempts = self._timeouts
                config = Config(
                    connect_timeout=connect,
                    read_timeout=read,
                    retries={"max_attempts": attempts, "mode": "standard"},
                )
                client = boto3.session.Session().client("s3", config=config, **self._kwargs)
                client.meta.events.register("before-send.s3", self._sender)
                self._client = client
            return self._client

    def store_key(self, src: SourceURI) -> str:
        """Fetches are bounded per store: the endpoint (one server for every bucket) or, on AWS,
        the bucket (each bucket its own host name)."""
        endpoint = self._kwargs["endpoint_url"]
        return f"s3:{endpoint}" if endpoint else f"s3:{src.location}"

    def list(self, src: SourceURI, deadline: float | None = None) -> list[RemoteFile]:
        files: list[RemoteFile] = []
        with _store_errors(src), self._sender.bounded(deadline):
            pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=src.location, Prefix=src.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(src.prefix) :]
                    if not name or name.endswith("/"):
                        continue  # "folder" marker objects
                    files.append(RemoteFile(name, int(obj["Size"]), str(obj.get("ETag", "")).strip('"')))
                if len(files) > MAX_LISTED:
                    break  # check_files refuses it anyway; do not page through a huge prefix
        if not files:
            raise SourceNotFound(f"no objects under {src}", param="source")
        return files

    def download(self, src: SourceURI, f: RemoteFile, dest: Path, deadline: float | None = None) -> None:
        with _store_errors(src), self._sender.bounded(deadline, max_bytes=f.size):
            # IfMatch: the bytes are those of the listed version, or the store says it changed.
            obj = self._s3().get_object(Bucket=src.location, Key=src.prefix + f.name, IfMatch=f.etag)
            body = obj["Body"]
            try:
                copy_bounded(body, dest, f.size, f"{src}{f.name}", deadline)
            finally:
                body.close()

    def close(self) -> None:
        self._sender.close()


class _store_errors:
    """botocore's failures as platform errors: the caller's fault (400) or the store's (503)."""

    def __init__(self, src: SourceURI) -> None:
        self.src = src

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> None:
        if exc is None or not isinstance(exc, Exception):
            return
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket", "NoSuchKey", "404"):
                raise SourceNotFound(f"{self.src}: {code}", param="source") from None
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise SourceRejected(f"{self.src}: access denied ({code})", param="source") from None
            if code in ("PreconditionFailed", "412"):
                raise StoreUnavailable(f"{self.src} changed while it was downloaded; try again") from None
            raise StoreUnavailable(f"{self.src}: the store answered {code or 'an error'}") from None
        if isinstance(exc, BotoCoreError):
            raise StoreUnavailable(f"{self.src}: the store is unreachable ({type(exc).__name__})") from None
        if isinstance(exc, OSError):
            raise StoreUnavailable(f"{self.src}: {exc}") from None
