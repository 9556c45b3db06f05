"""A ``redis-server`` of the test's own, for tests that stop or kill Redis."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.support.ports import free_port
from tests.support.serving import wait_until


class RedisServer:
    """A ``redis-server`` of the test's own on a spare port (never the machine's shared one)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        process = self.process
        wait_until(lambda: self.answers() or process.poll() is not None, 20, "redis-server")
        if process.poll() is not None:
            raise AssertionError(
                f"redis-server exited at once ({process.returncode}), port {self.port}"
            )
        return self

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        self.kill()


def redis_server_available() -> bool:
    return subprocess.run(["which", "redis-server"], capture_output=True).returncode == 0
