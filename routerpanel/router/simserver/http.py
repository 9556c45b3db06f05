"""Serve HTTP/1.1 the way cpp-httplib does (keep-alive limits, chunked bodies both ways, one
thread per connection) and translate it to ``Request`` and ``Reply`` for the app.
"""

from __future__ import annotations

import socket
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from routerpanel.router.simserver.app import SimServer
from routerpanel.router.simserver.common import ApiError, log
from routerpanel.router.simserver.replies import Reply, Request, json_reply

KEEP_ALIVE_S = 5.0  # cpp-httplib closes an idle keep-alive connection after 5 s ...
KEEP_ALIVE_MAX = 100  # ... or after 100 requests
IO_TIMEOUT_S = 600.0  # llama-server's --timeout default for reads and writes


class SimHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that binds fast (no reverse DNS) and takes IPv6 hosts."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: SimServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        super().__init__(address, SimHandler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's version calls socket.getfqdn()
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


class SimHandler(BaseHTTPRequestHandler):
    """Translate HTTP/1.1 (keep-alive, chunked bodies both ways) to Request and Reply."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
        # and the client's delayed ACK stall every reused connection by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._requests_on_connection = 0

    @property
    def _app(self) -> SimServer:
        assert isinstance(self.server, SimHTTPServer)
        return self.server.app

    def version_string(self) -> str:
        return "llama.cpp"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def handle_one_request(self) -> None:
        self.connection.settimeout(KEEP_ALIVE_S)  # idle keep-alive connections close after 5 s
        super().handle_one_request()

    def _dispatch(self) -> None:
        """Read one request, let the app answer it; a vanished client only ends the connection."""
        self.connection.settimeout(IO_TIMEOUT_S)
        self._requests_on_connection += 1
        try:
            request = self._read_request()
        except ApiError as exc:
            self._send(json_reply(exc.to_json(), exc.code))
            return
        try:
            self._app.respond(request, self._send)
        except OSError as exc:  # the client went away mid-response
            log.debug("connection lost: %s", exc)
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = _dispatch

    def _read_request(self) -> Request:
        url = urlsplit(self.path)
        headers = {name.lower(): value for name, value in self.headers.items()}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._read_chunked()
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise ApiError(400, "invalid Content-Length") from None
            body = self.rfile.read(length) if length > 0 else b""
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        return Request(self.command, url.path, query, headers, body)

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ApiError(400, "malformed chunked request body") from None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(8)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        if origin := self.headers.get("Origin"):
            self.send_header("Access-Control-Allow-Origin", origin)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.status >= 400 or self._requests_on_connection >= KEEP_ALIVE_MAX:
            self.close_connection = True  # cpp-httplib closes after every error response
        if self.close_connection:
            self.send_header("Connection", "close")
        else:
            self.send_header("Keep-Alive", f"timeout={KEEP_ALIVE_S:g}, max={KEEP_ALIVE_MAX}")
        if reply.chunks is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in reply.chunks:
                self.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        finally:
            reply.chunks.close()  # frees the slot if the client left mid-stream
