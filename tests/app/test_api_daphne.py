"""The HTTP surface under a real Daphne, over real sockets: chunks stream out as they come,
SSE stays open, and a client that hangs up is seen (Daphne's ``http.disconnect``).

Daphne runs in a subprocess (it owns the Twisted reactor) with the fake router on its in-memory
layer; the fake router prints each message it receives, which is how these tests see a
``router.cancel`` or ``router.release``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.paths import REPO
from tests.support.upstreams import SimServer

DEADLINE = 30.0

SERVER = r"""
import asyncio, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from daphne.server import Server  # installs the asyncio reactor
from twisted.internet import reactor
from channels.layers import InMemoryChannelLayer
from django.core.asgi import get_asgi_application
from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore, KeyTable
from models_app.routing.client import RouterClient
from tests.support.fake_router import FakeRouter, Grant, QueueThenGrant

layer = InMemoryChannelLayer()
fake = FakeRouter(layer)
fake.add("slow", Grant(int(sys.argv[1])), status="loaded")
fake.add("cold", QueueThenGrant(int(sys.argv[1])), status="unloaded")
fake.on_message = lambda m: print("router", m["type"], m.get("request_id", ""), flush=True)
app = Api(
    get_asgi_application(),
    router=RouterClient(layer, timeout=2.0),
    keys=KeyStore(lambda: KeyTable(False, {}), None),
    config=ApiConfig(sse_keepalive=0.5),
)
server = Server(app, endpoints=["tcp:port=0:interface=127.0.0.1"], signal_handlers=True)

def ready():
    asyncio.ensure_future(fake.start())
    print("listening", server.listening_addresses[0][1], flush=True)

reactor.callWhenRunning(ready)
server.run()
"""


class Daphne:
    def __init__(self, sim_port: int, data_dir: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "ROUTERPANEL_DATA_DIR": data_dir}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(sim_port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.port = int(self.expect("listening").split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str) -> str:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, "daphne exited"
                continue
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting with {prefix!r}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="module")
def daphne(slow_simserver: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    server = Daphne(slow_simserver.port, str(tmp_path_factory.mktemp("daphne")))
    yield server
    server.stop()


def chat(model: str, tokens: int) -> dict:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "stream": True, "max_tokens": tokens, "messages": messages}


def processing(sim: SimServer) -> float:
    text = httpx.get(f"http://127.0.0.1:{sim.port}/metrics", trust_env=False).text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:requests_processing "))
    return float(line.split()[1])


class TestUnderDaphne:
    def test_tokens_stream_out_chunked_as_they_come(self, daphne: Daphne) -> None:
        times: list[float] = []
        with (
            httpx.Client(base_url=daphne.url, trust_env=False, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/chat/completions", json=chat("slow", 10)) as response,
        ):
            assert response.status_code == 200
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.headers["server"] == "llama.cpp"
            for line in response.iter_lines():
                if line.startswith("data: "):
                    times.append(time.monotonic())
        assert len(times) >= 10
        assert times[-1] - times[0] > 0.3  # not one buffered body
        daphne.expect("router router.release")

    def test_a_small_answer_goes_out_with_the_childs_length_not_chunked(
        self, daphne: Daphne
    ) -> None:
        with httpx.Client(base_url=daphne.url, trust_env=False, timeout=DEADLINE) as http:
            response = http.post("/tokenize", json={"model": "slow", "content": "hello"})
        assert response.status_code == 200
        assert "transfer-encoding" not in response.headers
        assert response.headers["content-length"] == str(len(response.content))
        assert response.headers.get_list("x-accel-buffering") == ["no"]

    def test_a_client_that_hangs_up_mid_stream_is_seen(
        self, daphne: Daphne, slow_simserver: SimServer
    ) -> None:
        with (
            httpx.Client(base_url=daphne.url, trust_env=False, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/chat/completions", json=chat("slow", 100)) as response,
        ):
            lines = response.iter_lines()
            while not next(lines).startswith('data: {"choices":[{"finish_reason":null'):
                pass
        daphne.expect("router router.release")
        deadline = time.monotonic() + DEADLINE
        while processing(slow_simserver) != 0:
            assert time.monotonic() < deadline, "the child kept generating"
            time.sleep(0.05)

    def test_a_client_that_hangs_up_while_queued_leaves_the_queue(self, daphne: Daphne) -> None:
        body = chat("cold", 3)
        http = httpx.Client(base_url=daphne.url, trust_env=False, timeout=1.0)
        with contextlib.suppress(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body, headers={"x-request-id": "queued-1"})
        http.close()
        daphne.expect("router router.acquire queued-1")
        daphne.expect("router router.cancel queued-1")

    def test_sse_stays_open_with_keep_alives_and_django_still_serves(self, daphne: Daphne) -> None:
        with (
            httpx.Client(base_url=daphne.url, trust_env=False, timeout=DEADLINE) as http,
            http.stream("GET", "/models/sse") as response,
        ):
            assert response.headers["content-type"] == "text/event-stream"
            assert next(response.iter_lines()) == ": keep-alive"
        admin = httpx.get(daphne.url + "/admin/", trust_env=False, headers={"accept": "text/html"})
        assert admin.status_code == 302
