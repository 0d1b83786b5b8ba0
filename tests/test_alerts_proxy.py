"""Alerts through the proxy a cluster has (issue 25): the sender posts via httpx, which takes
HTTPS_PROXY / HTTP_PROXY / NO_PROXY from the environment. A real local receiver behind a tiny
asyncio HTTP proxy (CONNECT tunnels for https://, absolute-form forwarding for http://), all on
127.0.0.1; the https receiver has a throw-away certificate trusted through SSL_CERT_FILE."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
import time
from urllib.parse import urlsplit

import pytest
from test_alerts import Receiver, _until, receiver  # noqa: F401 - the fixture

from gradmon.server.alerts import AlertSender

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                   "all_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")


class Proxy:
    """An HTTP proxy on 127.0.0.1, on its own thread and loop (``address``), that records the
    request line of every request it is asked."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        async def serve() -> None:
            self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.address = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop)
        assert started.wait(10), "the proxy did not start"

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            self.requests.append(request_line)
            method, target, _version = request_line.split(" ", 2)
            if method == "CONNECT":  # https://: a tunnel; the TLS session is end to end
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # http://: forward the request in origin form
                url = urlsplit(target)
                up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                kept = [h for h in header_lines if h and not h.lower().startswith("proxy-")]
                up_writer.write(f"{method} {path} HTTP/1.1\r\n".encode("latin-1")
                                + "".join(f"{h}\r\n" for h in kept).encode("latin-1") + b"\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:
        with contextlib.suppress(OSError):
            sink.write_eof()


@pytest.fixture
def environment(monkeypatch):
    """A clean proxy environment for the test to set."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _abort(run: str) -> dict:
    return {"type": "event", "kind": "abort", "step": 3, "ts": time.time(), "message": f"{run} stopped"}


@pytest.fixture
def proxy():
    running = Proxy()
    yield running
    running.close()


def _send_one(url: str) -> dict:
    """Send one alert to ``url`` (the environment decides the route); the sender's counts."""

    async def main() -> dict:
        sender = AlertSender(url, retries=0)
        sender.start()
        sender.feed("exp1", [_abort("exp1")])
        await _until(lambda: sender.stats()["sent"] + sender.stats()["failed"] == 1)
        await sender.close()
        return sender.stats()

    return asyncio.run(main())


def test_http_webhook_goes_through_http_proxy(environment, proxy, receiver):  # noqa: F811
    hook = receiver("ok")
    environment.setenv("HTTP_PROXY", proxy.address)
    stats = _send_one(hook.url)
    assert stats["sent"] == 1 and "run exp1 aborted" in hook.bodies[0]["text"]
    assert proxy.requests == [f"POST {hook.url} HTTP/1.1"]  # the proxy carried it


def test_no_proxy_names_hosts_reached_directly(environment, proxy, receiver):  # noqa: F811
    hook = receiver("ok")
    environment.setenv("HTTP_PROXY", proxy.address)
    environment.setenv("NO_PROXY", "127.0.0.1")
    stats = _send_one(hook.url)
    assert stats["sent"] == 1 and len(hook.bodies) == 1 and proxy.requests == []


@pytest.fixture
def tls_receiver(tmp_path):
    """A webhook on https://127.0.0.1 with a throw-away certificate (``cert`` path for SSL_CERT_FILE)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    hook = Receiver("ok")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    hook.server.socket = context.wrap_socket(hook.server.socket, server_side=True)
    yield hook, cert
    hook.close()


def test_https_webhook_goes_through_https_proxy(environment, proxy, tls_receiver):
    hook, cert = tls_receiver
    url = hook.url.replace("http://", "https://")
    environment.setenv("HTTPS_PROXY", proxy.address)
    environment.setenv("SSL_CERT_FILE", str(cert))
    stats = _send_one(url)
    assert stats["sent"] == 1 and "run exp1 aborted" in hook.bodies[0]["text"]
    port = urlsplit(url).port
    assert proxy.requests == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]  # a tunnel: the proxy never sees the key


def test_a_proxy_that_is_down_fails_the_post_and_never_raises(environment, receiver):  # noqa: F811
    hook = receiver("ok")
    environment.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nothing listens
    async def main() -> dict:
        sender = AlertSender(hook.url, retries=1, retry_delay=0.01, timeout=2.0)
        sender.start()
        sender.feed("exp1", [_abort("exp1")])
        await _until(lambda: sender.stats()["failed"] == 1)
        await sender.close()
        return sender.stats()

    stats = asyncio.run(main())  # returns: nothing raised out of the sender
    assert stats["sent"] == 0 and stats["failed"] == 1 and hook.bodies == []
