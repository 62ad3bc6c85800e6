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
import os
import secrets
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from harness.emulator_server import ROOT, Emulator, EmulatorMissing, Request, SignedClient, data_dir
from harness.emulator_server import running as running_server

BINARY = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
API_VERSION = "2021-08-06"
# the standard headers a Shared Key signature covers, in its order
SIGNED_HEADERS = (
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
)


class AzuriteMissing(EmulatorMissing):
    pass


@dataclass
class BlobClient(SignedClient):
    """A minimal Blob API client (Shared Key, stdlib only): container creation and what
    :class:`~emulator_server.SignedClient` requests. Path-style URLs
    (``/<account>/<container>/<blob>``), as Azurite serves them."""

    host: str
    port: int
    account: str
    key: str
    container: str
    created = 201
    refused = 409  # BlobAlreadyExists, as Azure answers
    put_headers: ClassVar[dict[str, str]] = {"x-ms-blob-type": "BlockBlob"}
    list_query: ClassVar[dict[str, str]] = {"restype": "container", "comp": "list"}  # List Blobs
    list_marker = ("marker", "NextMarker")
    list_entry = ("Blob", "Name")

    def signed(self, req: Request) -> tuple[str, dict[str, str]]:
        path = f"/{self.account}/{urllib.parse.quote(self.container)}"
        if req.target:
            path += "/" + urllib.parse.quote(req.target, safe="/~")
        hdrs = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": API_VERSION}
        hdrs.update(req.headers)
        if req.body or req.method == "PUT":
            hdrs["content-length"] = str(len(req.body))
        values = [hdrs.get(h, "") for h in SIGNED_HEADERS]
        if values[2] == "0":
            values[2] = ""
        canonical_headers = "".join(f"{h}:{hdrs[h].strip()}\n" for h in sorted(hdrs) if h.startswith("x-ms-"))
        query = sorted(req.query.items())
        resource = f"/{self.account}{path}" + "".join(f"\n{k.lower()}:{v}" for k, v in query)
        to_sign = "\n".join([req.method, *values]) + "\n" + canonical_headers + resource
        mac = hmac.new(base64.b64decode(self.key), to_sign.encode(), hashlib.sha256).digest()
        hdrs["authorization"] = f"SharedKey {self.account}:{base64.b64encode(mac).decode()}"
        return path + ("?" + urllib.parse.urlencode(query) if query else ""), hdrs

    def create_store(self) -> None:
        """Create Container of the client's container (found already: nothing to do)."""
        self.expect(f"Create Container {self.container}", (201, 409), "PUT", query={"restype": "container"})


@dataclass(kw_only=True)
class AzuriteServer(Emulator):
    account: str
    key: str
    container: str

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


def start(base: Path, container: str | None = None, timeout: float = 60.0) -> AzuriteServer:
    """Start Azurite's Blob service on a free port of 127.0.0.1 with its data under
    ``base/azurite-data``, create ``container`` (default ``warehouse-<random>``), and return once
    it answers. Raises AzuriteMissing when it is not installed."""
    server = AzuriteServer(
        account="acct" + secrets.token_hex(4),
        key=base64.b64encode(secrets.token_bytes(64)).decode(),
        container=container or f"warehouse-{secrets.token_hex(4)}",
        data_dir=data_dir(base, "azurite-data", BINARY, "fetch_azurite.sh", AzuriteMissing),
        log_path=base / "azurite.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "AZURITE_"))}
    env["AZURITE_ACCOUNTS"] = f"{server.account}:{server.key}"
    command = [
        str(BINARY),
        "--blobHost",
        server.host,
        "--blobPort",
        str(server.port),
        "--location",
        str(server.data_dir),
        "--silent",
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]
    server.launch("Azurite", command, env, timeout)
    return server


def running(base: Path, container: str | None = None) -> contextlib.AbstractContextManager[AzuriteServer]:
    """:func:`start`, stopped when the block ends."""
    return running_server(start(base, container))
