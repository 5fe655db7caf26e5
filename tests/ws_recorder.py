"""A real local WebSocket receiver that records notification messages, for tests.

    with Recorder() as rec:
        deliver([rec.url()], {...}, now_ms=...)
        rec.wait_for(1)
        assert rec.messages[0]["streams"][0]["streamName"] == "s"

The port is chosen once at construction and kept across ``stop()``/``start()``,
so a test can take the receiver down and bring it back at the same URL.
"""

from __future__ import annotations

import errno
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from netutil import free_port
from websockets.sync.server import serve

HOST = "127.0.0.1"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost; returns (cert, key)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    if shutil.which("openssl"):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
            ],
            check=True,
            capture_output=True,
        )
        return cert, key
    return _self_signed_cryptography(cert, key)


def _self_signed_cryptography(cert: Path, key: Path) -> tuple[Path, Path]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    pkey = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(pkey.public_key())
    crt = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pkey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(pkey, hashes.SHA256())
    )
    key.write_bytes(
        pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert.write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    return cert, key


class Recorder:
    """Local WebSocket server on 127.0.0.1 recording every text frame as parsed JSON.

    Attributes useful in assertions: ``messages`` (parsed, arrival order),
    ``payloads`` (raw text), ``paths`` (request path of each accepted connection),
    ``ca_file`` (TLS only). Set ``reject_status`` to an HTTP status to refuse handshakes.
    """

    def __init__(self, *, tls: bool = False, port: int | None = None):
        self.port = port or free_port()
        self.tls = tls
        self.reject_status: int | None = None
        self.paths: list[str] = []
        self._payloads: list[str] = []
        self._messages: list[dict] = []
        self._cond = threading.Condition()
        self._server = None
        self._thread: threading.Thread | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.ca_file: str | None = None
        self._ssl: ssl.SSLContext | None = None
        if tls:
            self._tmp = tempfile.TemporaryDirectory(prefix="ws-recorder-")
            cert, key = _self_signed(Path(self._tmp.name))
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ssl.load_cert_chain(cert, key)
            self.ca_file = str(cert)

    # -- lifecycle -----------------------------------------------------------------

    def _bind(self, deadline: float) -> socket.socket:
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # SO_REUSEADDR lets a restart rebind the same port despite TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, self.port))
                sock.listen(64)
                return sock
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def start(self) -> Recorder:
        """Start listening (idempotent); rebinds the same port after ``stop()``."""
        if self._server is not None:
            return self
        sock = self._bind(time.monotonic() + 5)
        self._server = serve(
            self._handle, sock=sock, ssl=self._ssl, process_request=self._process_request, ping_interval=None
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name=f"ws-recorder-{self.port}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every open connection (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        """Stop and remove the TLS material."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- server side -----------------------------------------------------------------

    def _process_request(self, connection, request):
        if self.reject_status is not None:
            return connection.respond(self.reject_status, "rejected by Recorder\n")
        return None

    def _handle(self, ws) -> None:
        with self._cond:
            self.paths.append(ws.request.path)
        for frame in ws:
            text = frame if isinstance(frame, str) else frame.decode("utf-8", "replace")
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"_invalid_json": text}
            with self._cond:
                self._payloads.append(text)
                self._messages.append(parsed)
                self._cond.notify_all()

    # -- client side -----------------------------------------------------------------

    def url(self, path: str = "/notify") -> str:
        scheme = "wss" if self.tls else "ws"
        return f"{scheme}://{HOST}:{self.port}{path}"

    @property
    def messages(self) -> list[dict]:
        with self._cond:
            return list(self._messages)

    @property
    def payloads(self) -> list[str]:
        with self._cond:
            return list(self._payloads)

    def events(self) -> list[dict]:
        """All received events in order, each with its ``streamName`` added."""
        return [
            {"streamName": s["streamName"], **ev}
            for m in self.messages
            for s in m.get("streams", [])
            for ev in s.get("events", [])
        ]

    def clear(self) -> None:
        with self._cond:
            self._messages.clear()
            self._payloads.clear()
            self.paths.clear()

    def wait_for(self, predicate_or_count: int | Callable[[list[dict]], bool], timeout: float = 10) -> list[dict]:
        """Wait until ``count`` messages arrived or ``predicate(messages)`` holds; return the messages."""
        if callable(predicate_or_count):
            predicate = predicate_or_count
        else:
            count = int(predicate_or_count)

            def predicate(msgs: list[dict]) -> bool:
                return len(msgs) >= count

        with self._cond:
            if self._cond.wait_for(lambda: predicate(list(self._messages)), timeout):
                return list(self._messages)
            got = len(self._messages)
        raise AssertionError(
            f"Recorder on port {self.port}: condition not met within {timeout}s ({got} message(s) received)"
        )
