"""Local stand-ins for remote storage, on loopback only, started and stopped by
the tests: an HTTP server with Range support (what fsspec's HTTP filesystem
reads) that can also fail on purpose, moto's S3 API server, a proxy in
front of it that cuts connections or answers errors on purpose, and a TCP
relay that counts the bytes one client exchanges with a server.

The HTTP server counts what it sends per object, so a test can tell how many
times an input was downloaded.
"""
from __future__ import annotations

import collections
import os
import re
import socket
import socketserver
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class ObjectServer(ThreadingHTTPServer):
    """Serves ``objects`` (path -> bytes).  Paths under ``/forbidden/`` answer
    403; under ``/drop/`` the server sends the headers of the whole object (or
    range), then its bytes up to three quarters of the object, then closes
    the socket."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[str, bytes] = {}
        self.gets: collections.Counter = collections.Counter()  # GET requests per path
        self.bytes_sent: collections.Counter = collections.Counter()  # body bytes per path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class _Handler(BaseHTTPRequestHandler):
    server: ObjectServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self.server.gets[self.path] += 1
        self._answer(with_body=True)

    def _answer(self, *, with_body: bool) -> None:
        path = self.path
        if path.startswith("/forbidden/"):
            self._refuse(403, b"Forbidden")
            return
        body = self.server.objects.get(path)
        if body is None:
            self._refuse(404, b"Not Found")
            return
        start, end = 0, len(body)
        wanted = RANGE.match(self.headers.get("Range", ""))
        if wanted:
            first, last = wanted.groups()
            start = int(first) if first else max(0, len(body) - int(last))
            end = min(len(body), int(last) + 1) if first and last else len(body)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not with_body:
            return
        if path.startswith("/drop/"):
            end = max(start, min(end, len(body) * 3 // 4))
            self.close_connection = True
        piece = body[start:end]
        self.wfile.write(piece)
        self.wfile.flush()
        self.server.bytes_sent[path] += len(piece)

    def _refuse(self, status: int, text: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(text)


@contextmanager
def object_server() -> Iterator[ObjectServer]:
    with _serving(ObjectServer()) as server:
        yield server


@contextmanager
def _serving(server: socketserver.BaseServer) -> Iterator:
    """``server`` answering from a thread of its own until the block ends."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 API in server mode on a free loopback port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


S3_SETTINGS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
               "AWS_CONFIG_FILE": os.devnull}
"""What makes boto3 and s3fs talk to the test server only (with AWS_ENDPOINT_URL)."""


@contextmanager
def s3_environment() -> Iterator[str]:
    """moto's S3 server, with this process's environment pointing at it
    (AWS_ENDPOINT_URL and :data:`S3_SETTINGS`, as they were afterwards);
    yields its endpoint URL."""
    saved = {name: os.environ.get(name) for name in [*S3_SETTINGS, "AWS_ENDPOINT_URL"]}
    os.environ.update(S3_SETTINGS)
    try:
        with s3_server() as endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class CountingProxy(socketserver.ThreadingTCPServer):
    """A TCP relay on loopback to ``upstream`` (host, port) that counts every
    byte it carries, both ways: what one client of a server sends and
    receives on the network, whatever library speaks through it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = upstream
        self.carried = 0
        self._lock = threading.Lock()

    def count(self, size: int) -> None:
        with self._lock:
            self.carried += size

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(socketserver.BaseRequestHandler):
    server: CountingProxy

    def handle(self) -> None:
        with socket.create_connection(self.server.upstream) as upstream:
            back = threading.Thread(target=self._pump, args=(upstream, self.request), daemon=True)
            back.start()
            self._pump(self.request, upstream)
            back.join()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                self.server.count(len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass


@contextmanager
def counting_proxy(endpoint: str) -> Iterator[CountingProxy]:
    """A :class:`CountingProxy` to the server at ``endpoint`` (``http://host:port``)."""
    host, port = endpoint.rsplit("/", 1)[-1].rsplit(":", 1)
    with _serving(CountingProxy((host, int(port)))) as proxy:
        yield proxy


class Fault:
    """What :class:`FaultProxy` does to one request instead of forwarding it plainly."""

    def __init__(self, kind: str, status: int = 0, code: str = "") -> None:
        self.kind, self.status, self.code = kind, status, code


CUT_RESPONSE = Fault("cut response")  # forward; send the headers and half the body, then close the socket
CUT_REQUEST = Fault("cut request")  # read half the request's body, then close the socket without an answer


def s3_error(status: int, code: str) -> Fault:
    """An S3 error answer (``<Error><Code>...``) in place of the store's."""
    return Fault("error", status, code)


class FaultProxy(ThreadingHTTPServer):
    """An HTTP proxy on loopback in front of an S3 endpoint (moto's): every
    request is forwarded as it came unless :attr:`fault`, called with
    (method, path with query, headers), returns a :class:`Fault` for it."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream.split("://", 1)[1]
        self.fault = lambda method, path, headers: None
        self.faults: collections.Counter = collections.Counter()  # faults served, by kind

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    server: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _request_body(self, limit: int | None = None) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return bytes(body)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length if limit is None else min(limit, length))

    def _forward(self) -> None:
        import http.client

        fault = self.server.fault(self.command, self.path, self.headers)
        if fault is not None:
            self.server.faults[fault.kind] += 1
        if fault is not None and fault.kind == "cut request":
            self._request_body(int(self.headers.get("Content-Length") or 0) // 2)
            self.close_connection = True
            return
        body = self._request_body()
        if fault is not None and fault.kind == "error":
            text = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{fault.code}</Code>"
                    f"<Message>{fault.code}</Message></Error>").encode()
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=60)
        try:
            headers = {name: value for name, value in self.headers.items()
                       if name.lower() not in ("transfer-encoding", "expect")}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                         else str(len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault is not None and fault.kind == "cut response":
            payload = payload[: len(payload) // 2]
            self.close_connection = True
        self.wfile.write(payload)
        self.wfile.flush()


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    with _serving(FaultProxy(upstream)) as proxy:
        yield proxy
