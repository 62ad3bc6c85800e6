"""Azure Blob Storage for the tests: Azurite (Microsoft's emulator, MIT, from npm) on 127.0.0.1,
its blobs as files in a temp folder.

``scripts/fetch_azurite.sh`` (run by scripts/setup.sh) installs it into ``.tools/azurite``. It
serves the Blob API, which is what delta-rs (object_store) and Arrow's AzureFileSystem speak, but
not the Data Lake Storage Gen2 (``dfs``) API that Hadoop's ABFS connector needs: Spark cannot
write to it. docs/object-stores.md says what is tested on it and what is not. Use::

    with azurite_server.running(tmp_path) as az:   # or az = azurite_server.start(tmp_path); az.stop()
        az.environment()           # the standard AZURE_* variables the sink reads
        az.url("wh")               # abfss://<container>@<account>.dfs.core.windows.net/wh
        az.client().put("k", b"v", if_none_match="*")

Each server has an account of its own with a random key (``AZURITE_ACCOUNTS``, passed in its
environment, never on its command line) and a container ``warehouse-<random>``.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import os
import secrets
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from s3_server import _die_with_parent, _free_port

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
API_VERSION = "2021-08-06"


class AzuriteMissing(RuntimeError):
    pass


@dataclass
class BlobClient:
    """A minimal Blob API client (Shared Key, stdlib only) for the tests' own requests: container
    creation, conditional puts, reads, listings; independent of the sink's code. Path-style URLs
    (``/<account>/<container>/<blob>``), as Azurite serves them."""

    host: str
    port: int
    account: str
    key: str
    container: str
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def signed(
        self,
        method: str,
        blob: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[str, dict[str, str]]:
        """The request target and the headers of a Shared Key signed request."""
        path = f"/{self.account}/{urllib.parse.quote(self.container)}"
        if blob:
            path += "/" + urllib.parse.quote(blob, safe="/~")
        hdrs = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": API_VERSION}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        if body or method == "PUT":
            hdrs["content-length"] = str(len(body))
        std = [
            "content-encoding",
            "content-language",
            "content-length",
            "content-md5",
            "content-type",
            "date",
            "if-modified-since",
            "if-match",
            "if-none-match",
            "if-unmodified-since",
            "range",
        ]
        values = [hdrs.get(h, "") for h in std]
        if values[2] == "0":
            values[2] = ""
        canonical_headers = "".join(f"{h}:{hdrs[h].strip()}\n" for h in sorted(hdrs) if h.startswith("x-ms-"))
        resource = f"/{self.account}{path}" + "".join(f"\n{k.lower()}:{v}" for k, v in sorted((query or {}).items()))
        to_sign = "\n".join([method, *values]) + "\n" + canonical_headers + resource
        mac = hmac.new(base64.b64decode(self.key), to_sign.encode(), hashlib.sha256).digest()
        hdrs["authorization"] = f"SharedKey {self.account}:{base64.b64encode(mac).decode()}"
        return path + ("?" + urllib.parse.urlencode(sorted((query or {}).items())) if query else ""), hdrs

    def request(
        self,
        method: str,
        blob: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        url, hdrs = self.signed(method, blob, body, headers, query)
        for attempt in (1, 2):  # one retry on a connection the server closed while it sat idle
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self._conn.request(method, url, body=body, headers=hdrs)
                resp = self._conn.getresponse()
                return resp.status, resp.read()
            except (ConnectionError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def raw_put(self, blob: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        """A signed Put Blob as the bytes to send on a fresh connection (``Connection: close``),
        for tests that hold a request back before its last byte."""
        hdrs = {"x-ms-blob-type": "BlockBlob", **(headers or {})}
        url, hdrs = self.signed("PUT", blob, body, hdrs)
        hdrs.update({"host": f"{self.host}:{self.port}", "connection": "close"})
        head = f"PUT {url} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        return head.encode() + body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def create_container(self) -> None:
        status, data = self.request("PUT", query={"restype": "container"})
        if status not in (201, 409):
            raise AssertionError(f"Create Container {self.container}: HTTP {status}: {data[:300]!r}")

    def put(self, blob: str, body: bytes, if_none_match: str | None = None) -> int:
        """Put Blob; returns the HTTP status (201, or 409 when ``If-None-Match: *`` finds the blob)."""
        headers = {"x-ms-blob-type": "BlockBlob"}
        if if_none_match:
            headers["If-None-Match"] = if_none_match
        status, data = self.request("PUT", blob, body, headers)
        if status not in (201, 409, 412):
            raise AssertionError(f"PUT {blob}: HTTP {status}: {data[:300]!r}")
        return status

    def get(self, blob: str) -> bytes | None:
        status, data = self.request("GET", blob)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {blob}: HTTP {status}: {data[:300]!r}")
        return data

    def list_blobs(self, prefix: str = "") -> list[str]:
        import xml.etree.ElementTree as ET

        names: list[str] = []
        marker = ""
        while True:
            query = {"restype": "container", "comp": "list", "prefix": prefix}
            if marker:
                query["marker"] = marker
            status, data = self.request("GET", query=query)
            if status != 200:
                raise AssertionError(f"List Blobs {prefix}: HTTP {status}: {data[:300]!r}")
            root = ET.fromstring(data)
            names += [b.findtext("Name") or "" for b in root.iter("Blob")]
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return names


@dataclass
class AzuriteServer:
    host: str
    port: int
    account: str
    key: str
    container: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The account's Blob endpoint (path-style: the account is the first path segment)."""
        return f"http://{self.host}:{self.port}/{self.account}"

    def client(self) -> BlobClient:
        return BlobClient(self.host, self.port, self.account, self.key, self.container)

    def url(self, path: str = "", scheme: str = "abfss") -> str:
        """``abfss://<container>@<account>.dfs.core.windows.net/<path>`` (the form Spark's ABFS
        and delta-rs both take), or with ``scheme="az"``: ``az://<container>/<path>``."""
        if scheme == "az":
            return f"az://{self.container}/{path.lstrip('/')}"
        return f"{scheme}://{self.container}@{self.account}.dfs.core.windows.net/{path.lstrip('/')}"

    def environment(self) -> dict[str, str]:
        """The standard Azure variables a deployment sets for this account; ``AZURE_STORAGE_ENDPOINT``
        points at the emulator (on Azure it is left unset)."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": self.account,
            "AZURE_STORAGE_ACCOUNT_KEY": self.key,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
        }

    def storage_options(self) -> dict[str, str]:
        """delta-rs (deltalake 1.x) options for this server: put-if-absent is its default commit
        on Azure; ``AZURE_ALLOW_HTTP`` because the emulator speaks plain HTTP."""
        return {**self.environment(), "AZURE_ALLOW_HTTP": "true"}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def start(base: Path, container: str | None = None, timeout: float = 60.0) -> AzuriteServer:
    """Start Azurite's Blob service on a free port of 127.0.0.1 with its data under
    ``base/azurite-data``, create ``container`` (default ``warehouse-<random>``), and return once
    it answers. Raises AzuriteMissing when it is not installed."""
    if not BINARY.exists():
        raise AzuriteMissing(
            f"{BINARY.relative_to(ROOT)} is missing: run scripts/fetch_azurite.sh (scripts/setup.sh does)"
        )
    base.mkdir(parents=True, exist_ok=True)
    data_dir = base / "azurite-data"
    data_dir.mkdir(exist_ok=True)
    port = _free_port()
    server = AzuriteServer(
        host="127.0.0.1",
        port=port,
        account="acct" + secrets.token_hex(4),
        key=base64.b64encode(secrets.token_bytes(64)).decode(),
        container=container or f"warehouse-{secrets.token_hex(4)}",
        data_dir=data_dir,
        log_path=base / "azurite.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "AZURITE_"))}
    env["AZURITE_ACCOUNTS"] = f"{server.account}:{server.key}"
    command = [
        str(BINARY),
        "--blobHost",
        server.host,
        "--blobPort",
        str(port),
        "--location",
        str(data_dir),
        "--silent",
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]
    with open(server.log_path, "wb") as log:
        server.proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + timeout
    client = server.client()
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"Azurite exited with {server.proc.returncode}: see {server.log_path}")
        try:
            client.create_container()
            break
        except (ConnectionError, OSError):
            client.close()
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(
                    f"Azurite did not answer on port {port} within {timeout:.0f} s: see {server.log_path}"
                ) from None
            time.sleep(0.05)
    client.close()
    return server


@contextlib.contextmanager
def running(base: Path, container: str | None = None) -> Iterator[AzuriteServer]:
    server = start(base, container)
    try:
        yield server
    finally:
        server.stop()
