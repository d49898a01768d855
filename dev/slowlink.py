"""A TCP link in front of a local server that can be made slow on demand: the chaos harness's
``slow_get`` (``bench/chaos/objects.py``) puts one in front of the S3 server, and while it is
slowed every GET of an object is held a few seconds before it reaches the server and its answer
trickles back -- what a congested network or an overloaded store does to a reader. Listings,
uploads and everything else pass at full speed, so the producers (the oracle) are not slowed.

One thread accepts; each connection gets two pumping threads. A request is recognized by its
first bytes (``GET /bucket/key``, no listing query): HTTP/1.1 keep-alive sends the requests of a
connection one after another, each starting a chunk the client writes, so the check sees each
one. The server may be killed and started again on its port behind the link: a connection then
fails as a client's would (reset), and the next one reaches the server again.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time

from dev.embedded import free_port

#: How much of an answer passes between two pauses while the link is slow, and the pause.
TRICKLE_BYTES, TRICKLE_PAUSE = 16 * 1024, 0.05


def object_get(head: bytes) -> bool:
    """Whether a request's first bytes are a GET of an object: ``GET /bucket/key`` -- not a
    listing (``GET /bucket?list-type=2...``, ``GET /bucket/``) or the service's root."""
    if not head.startswith(b"GET /"):
        return False
    target = head[4:].split(b" ", 1)[0]
    path, _, query = target.partition(b"?")
    bucket, _, key = path[1:].partition(b"/")
    return bool(bucket and key) and b"list-type" not in query and b"uploads" not in query


class SlowLink:
    """127.0.0.1:``port`` -> 127.0.0.1:``target_port``; ``slow(seconds, hold)`` for a while."""

    def __init__(self, target_port: int, *, seed: int = 0) -> None:
        self.target_port = target_port
        self.port = 0
        self._until = 0.0
        self._hold = (0.0, 0.0)
        self._rng = random.Random(seed)
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self.held = 0  # object GETs held so far

    def start(self) -> SlowLink:
        if self._sock is not None:
            return self
        self.port = self.port or free_port()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self._sock = sock
        self._closed.clear()
        threading.Thread(target=self._accept, name=f"slowlink-{self.port}", daemon=True).start()
        return self

    def slow(self, seconds: float, hold: tuple[float, float] = (1.0, 4.0)) -> None:
        """For ``seconds`` from now, hold each object GET ``hold`` seconds (uniform) and trickle its answer."""
        self._hold = hold
        self._until = time.monotonic() + seconds

    @property
    def slowed(self) -> bool:
        return time.monotonic() < self._until

    def stop(self) -> None:
        self._closed.set()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _accept(self) -> None:
        sock = self._sock
        while sock is not None and not self._closed.is_set():
            try:
                client, _ = sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                server.settimeout(None)
            except OSError:  # the server is down: the client sees its connection reset
                client.close()
                continue
            slow = threading.Event()  # this connection's answer trickles (its last request was held)
            threading.Thread(target=self._pump, args=(client, server, slow, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, slow, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: threading.Event, requests: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if requests:
                    if self.slowed and object_get(chunk[:2048]):
                        self.held += 1
                        slow.set()
                        time.sleep(self._rng.uniform(*self._hold))
                    else:
                        slow.clear()
                    dst.sendall(chunk)
                    continue
                step = TRICKLE_BYTES if slow.is_set() else len(chunk)
                for at in range(0, len(chunk), step):
                    dst.sendall(chunk[at:at + step])
                    if step == TRICKLE_BYTES:
                        time.sleep(TRICKLE_PAUSE)
        except OSError as exc:
            logging.debug("slowlink %d: %s", self.port, exc)
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
