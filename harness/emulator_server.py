"""What the tests' object-store emulators share (harness/s3_server.py: versitygw, S3's API;
harness/azurite_server.py: Azurite, Azure Blob's API): a server process on a free port of
127.0.0.1 that ends with the process that started it, started and waited for until it answers,
and a minimal signing HTTP client for the tests' own requests, independent of the sink's code.

Each emulator's module holds only what is its own: how a request is signed, its binary, its
credentials and its settings for the sink. Neither module needs pytest: bench/s3_costs.py and
tests/chaos.py start servers outside a test.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

ROOT = Path(__file__).resolve().parents[1]


class EmulatorMissing(RuntimeError):
    """The emulator's binary is not installed (the message names the script that installs it)."""


def data_dir(base: Path, name: str, binary: Path, fetch: str, missing: type[EmulatorMissing]) -> Path:
    """``base/<name>``, created, for a server's data; ``missing`` naming ``scripts/<fetch>``
    (which installs the emulator) when ``binary`` is not installed."""
    if not binary.exists():
        raise missing(f"{binary.relative_to(ROOT)} is missing: run scripts/{fetch} (scripts/setup.sh does)")
    (base / name).mkdir(parents=True, exist_ok=True)
    return base / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(
    proc: subprocess.Popen, answers: Callable[[], bool], timeout: float, failed: Callable[[], str]
) -> None:
    """Return once ``answers()`` (asked every half second) says the server ``proc`` is up;
    RuntimeError(``failed()``) if ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(failed())
        time.sleep(0.5)


def terminate(proc: subprocess.Popen, grace: float = 30) -> None:
    """End the server ``proc``: SIGTERM, then SIGKILL if it is still running ``grace`` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def die_with_parent() -> None:
    """In the server's process before exec: end it when the process that started it ends
    (a killed test worker leaves no server behind). Linux only; elsewhere a no-op."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class Request:
    """One request as a client signs it: ``target`` is the object's key (None: the bucket or
    container itself), ``headers`` lower-cased."""

    method: str
    target: str | None = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)


class SignedClient:
    """A keep-alive connection to an emulator, and the requests the tests make of any object
    store (conditional puts, reads, listings). A subclass signs (:meth:`signed`), names the
    store's own statuses and listing elements, and creates its bucket or container."""

    host: str
    port: int
    _conn: http.client.HTTPConnection | None = None
    created = 200  # a put's status when it stored the object
    refused = 412  # a put-if-absent's status when the key exists
    put_headers: ClassVar[dict[str, str]] = {}  # every put carries these
    # the listing: its query, the next page's (query parameter, element), each key's (element, name)
    list_query: ClassVar[dict[str, str]]
    list_marker: ClassVar[tuple[str, str]]
    list_entry: ClassVar[tuple[str, str]]

    def signed(self, req: Request) -> tuple[str, dict[str, str]]:
        """The request target (path and query) and the headers of the signed request."""
        raise NotImplementedError

    def create_store(self) -> None:
        """Create the bucket or container the client's keys live in."""
        raise NotImplementedError

    def request(
        self,
        method: str,
        target: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, lower-cased response headers, body) of a signed request."""
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        url, hdrs = self.signed(Request(method, target, body, lowered, dict(query or {})))
        for attempt in (1, 2):  # one retry on a connection the server closed while it sat idle
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self._conn.request(method, url, body=body, headers=hdrs)
                resp = self._conn.getresponse()
                data = resp.read()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def raw_put(self, target: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        """A signed put as the bytes to send on a fresh connection (``Connection: close``), for
        tests that hold a request back before its last byte."""
        lowered = {**self.put_headers, **{k.lower(): v for k, v in (headers or {}).items()}}
        url, hdrs = self.signed(Request("PUT", target, body, lowered))
        hdrs = {"host": f"{self.host}:{self.port}", "content-length": str(len(body)), **hdrs, "connection": "close"}
        head = f"PUT {url} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        return head.encode() + body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def expect(
        self, what: str, ok: tuple[int, ...], method: str, target: str | None = None, body: bytes = b"", **kw
    ) -> tuple[int, bytes]:
        """(status, body) of a request (``kw``: its headers, query) answered with a status in
        ``ok``; any other fails naming ``what``."""
        status, _, data = self.request(method, target, body, **kw)
        if status not in ok:
            raise AssertionError(f"{what}: HTTP {status}: {data[:300]!r}")
        return status, data

    def put(self, target: str, body: bytes, if_none_match: str | None = None) -> int:
        """Put the object; returns the HTTP status (:attr:`created`, or :attr:`refused` when
        ``If-None-Match: *`` finds the key)."""
        headers = {**self.put_headers, **({"if-none-match": if_none_match} if if_none_match else {})}
        return self.expect(f"PUT {target}", (self.created, self.refused, 412), "PUT", target, body, headers=headers)[0]

    def get(self, target: str) -> bytes | None:
        """The object's bytes, None when there is none."""
        status, data = self.expect(f"GET {target}", (200, 404), "GET", target)
        return None if status == 404 else data

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, page after page."""
        keys: list[str] = []
        param, next_marker = self.list_marker
        entry, name = self.list_entry
        marker = ""
        while True:
            query = {**self.list_query, "prefix": prefix, **({param: marker} if marker else {})}
            root = ET.fromstring(self.expect(f"listing {prefix}", (200,), "GET", query=query)[1])
            for e in root.iter():  # S3 answers in a namespace, Azure in none
                e.tag = e.tag.rsplit("}", 1)[-1]
            keys += [e.findtext(name) or "" for e in root.iter(entry)]
            marker = root.findtext(next_marker) or ""
            if not marker:
                return keys


@dataclass(kw_only=True)
class Emulator:
    """A running emulator: where it listens (a free port of 127.0.0.1 by default), its data and
    log, its process."""

    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def client(self) -> SignedClient:
        raise NotImplementedError

    def launch(self, name: str, command: list[str], env: dict[str, str], timeout: float) -> None:
        """Run ``command`` (its output into :attr:`log_path`) and return once the client created
        its bucket or container; ``name`` is the emulator's, for the errors."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}: see {self.log_path}")
            try:
                client.create_store()
                break
            except (ConnectionError, OSError):
                client.close()
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"{name} did not answer on port {self.port} within {timeout:.0f} s: see {self.log_path}"
                    ) from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


E = TypeVar("E", bound=Emulator)


@contextlib.contextmanager
def running(server: E) -> Iterator[E]:
    """``server``, stopped when the block ends."""
    try:
        yield server
    finally:
        server.stop()
