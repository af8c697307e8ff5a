"""S3 for tests and benchmarks: moto's standalone server in its own process on loopback (a real
S3-compatible HTTP endpoint), and ``RawStore``, a store that misbehaves on purpose."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from pathlib import Path

from .net import free_port
from .process import ServerProcess

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MotoServer(ServerProcess):
    """moto's server on a free port of its own; ``stop()`` then ``start()`` brings it back on the same
    port (an outage of the store), ``close()`` ends it."""

    def __init__(self, log_dir: Path, start_timeout: float = 120) -> None:
        port = free_port()
        super().__init__(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            port=port,
            log=Path(log_dir) / f"moto-{port}.log",
            ready_path="/moto-api/",
            ready_status=None,  # any answer: it serves
            start_timeout=start_timeout,
        )

    @property
    def name(self) -> str:
        return "moto"

    def stop(self, timeout: float = 10, sig: int = signal.SIGKILL) -> None:
        super().stop(timeout, sig)  # moto keeps nothing worth a clean shutdown

    def close(self) -> None:
        self.kill()

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )

    def put_folder(self, bucket: str, prefix: str, files: dict[str, bytes]) -> str:
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        for name, data in files.items():
            s3.put_object(Bucket=bucket, Key=prefix + name, Body=data)
        return f"s3://{bucket}/{prefix}"


class RawStore:
    """A misbehaving store on loopback, one thread per connection, counting what it did:
    ``hole`` accepts and never answers; ``trickle`` answers 200 with a large Content-Length and
    then one byte every ``interval`` seconds, forever; ``trickle_head`` the same inside a header; ``huge`` answers 200 with a body of
    ``size`` bytes as fast as the reader takes them."""

    def __init__(self, behaviour: str, interval: float = 0.2, size: int = 1 << 30) -> None:
        self.behaviour, self.interval, self.size = behaviour, interval, size
        self.accepted = 0
        self.bytes_sent = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self._conns.append(conn)
            if self.behaviour != "hole":
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            conn.recv(65536)  # the request (its head is enough)
            if self.behaviour == "trickle_head":  # the status line, then a header that never ends
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not self._stop.is_set():
                    conn.sendall(b"a")
                    self.bytes_sent += 1
                    time.sleep(self.interval)
                return
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {self.size}\r\n\r\n"
            conn.sendall(head.encode())
            block = b"<" * (1 << 16)
            sent = 0
            while not self._stop.is_set() and sent < self.size:
                if self.behaviour == "trickle":
                    conn.sendall(b"<")
                    sent += 1
                    self.bytes_sent += 1
                    time.sleep(self.interval)
                else:
                    piece = block[: self.size - sent]
                    conn.sendall(piece)
                    sent += len(piece)
                    self.bytes_sent += len(piece)
        except OSError:
            return  # the reader gave up and closed the connection

    def close(self) -> None:
        self._stop.set()
        for c in self._conns:
            c.close()
        self._sock.close()
