"""What the servers the project starts for the demo, the tests and the benchmarks share (the Kafka
broker, S3Proxy, HDFS): one process group under ``base_dir``, killed (a crash) or stopped, started
again on the same ports with its data, removed on request."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path


class Server:
    """A server in a process group of its own: subclasses set ``proc`` in ``start(timeout)``."""

    #: How long a SIGTERM may take before the server is killed.
    stop_seconds: float = 30

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.base_dir = Path(base_dir)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> Server:
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed, requests under way cut)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def restart(self, *, kill: bool = False, timeout: float = 120) -> None:
        """Stop (or kill) the server and start it again on the same ports, with its data."""
        if kill:
            self.kill()
        else:
            self._terminate()
        self.start(timeout)

    def _terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(self.stop_seconds)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self, *, remove: bool = False) -> None:
        self._terminate()
        self.proc = None
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)
