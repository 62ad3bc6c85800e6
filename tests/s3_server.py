"""A real S3 API server for the tests: Versity S3 Gateway (versitygw) on 127.0.0.1, storing
objects as files in a temp folder (its POSIX backend).

Why versitygw (docs/object-stores.md): Apache-2.0, one Go binary built from the Go module proxy
(``scripts/fetch_s3_server.sh``, run by scripts/setup.sh, puts it in ``.tools/``), starts in well
under a second, and since v1.8.0 it checks ``If-None-Match: *`` / ``If-Match`` on ``PutObject``
under a per-key publish lock (an in-process stripe plus ``flock`` on a per-bucket lock file), so
concurrent put-if-absent of one key has exactly one winner; uploads are staged in unnamed
``O_TMPFILE`` files, so a listing never shows a half-written object. tests/test_s3_store.py
measures both. Use::

    with s3_server.running(tmp_path) as s3:      # or s3 = s3_server.start(tmp_path); s3.stop()
        s3.storage_options()                     # for delta-rs (deltalake)
        s3.hadoop_conf()                         # for Spark through s3a (spark.hadoop.fs.s3a.*)
        s3.client().put("k", b"v", if_none_match="*")

The credentials are random per server and reach the server through its environment, not its
command line; ``secret_key`` is the value a no-secret-in-logs test greps for. Each server gets a
bucket of its own name (``warehouse-<random>``): Hadoop caches one S3A file system per bucket
for the life of a JVM, so a shared Spark session never talks to a stopped server's endpoint.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import os
import secrets
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / ".tools" / "versitygw"
REGION = "us-east-1"


class S3ServerMissing(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


@dataclass
class S3Client:
    """A minimal path-style S3 client (AWS Signature V4, stdlib only): enough for the tests' own
    requests (bucket creation, conditional puts, reads, listings), independent of the sink's code."""

    host: str
    port: int
    access_key: str
    secret_key: str
    bucket: str
    region: str = REGION
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def signed(
        self,
        method: str,
        key: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        bucket: str | None = None,
    ) -> tuple[str, dict[str, str]]:
        """The request target (path and query) and the headers of a signed request."""
        bucket = self.bucket if bucket is None else bucket
        path = "/" + urllib.parse.quote(bucket) + ("/" + urllib.parse.quote(key, safe="/~") if key else "")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        now = dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        hdrs = {"host": f"{self.host}:{self.port}", "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        signed = sorted(hdrs)
        canonical = "\n".join(
            [
                method,
                path,
                canonical_query,
                *(f"{h}:{hdrs[h].strip()}" for h in signed),
                "",
                ";".join(signed),
                payload_hash,
            ]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = _sign(("AWS4" + self.secret_key).encode(), day)
        for part in (self.region, "s3", "aws4_request"):
            k = _sign(k, part)
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        hdrs["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, SignedHeaders={';'.join(signed)}, Signature={signature}"
        )
        return path + (f"?{canonical_query}" if canonical_query else ""), hdrs

    def request(
        self,
        method: str,
        key: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        bucket: str | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        url, hdrs = self.signed(method, key, body, headers, query, bucket)
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

    def raw_put(self, key: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        """A signed PutObject as the bytes to send on a fresh connection (``Connection: close``),
        for tests that hold a request back before its last byte."""
        hdrs = {**(headers or {}), "content-length": str(len(body)), "connection": "close"}
        url, hdrs = self.signed("PUT", key, body, hdrs)
        head = f"PUT {url} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        return head.encode() + body

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def put(self, key: str, body: bytes, if_none_match: str | None = None) -> int:
        """PutObject; returns the HTTP status (200, or 412 when ``If-None-Match: *`` finds the key)."""
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        status, _, data = self.request("PUT", key, body, headers)
        if status not in (200, 412):
            raise AssertionError(f"PUT {key}: HTTP {status}: {data[:300]!r}")
        return status

    def get(self, key: str) -> bytes | None:
        status, _, data = self.request("GET", key)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {key}: HTTP {status}: {data[:300]!r}")
        return data

    def create_bucket(self, bucket: str) -> None:
        status, _, data = self.request("PUT", bucket=bucket)
        if status != 200:
            raise AssertionError(f"CreateBucket {bucket}: HTTP {status}: {data[:300]!r}")

    def list_keys(self, prefix: str = "") -> list[str]:
        import xml.etree.ElementTree as ET

        keys: list[str] = []
        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            status, _, data = self.request("GET", query=query)
            if status != 200:
                raise AssertionError(f"ListObjectsV2 {prefix}: HTTP {status}: {data[:300]!r}")
            root = ET.fromstring(data)
            ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
            keys += [c.findtext(f"{ns}Key") or "" for c in root.iter(f"{ns}Contents")]
            token = root.findtext(f"{ns}NextContinuationToken")
            if not token:
                return keys


@dataclass
class S3Server:
    host: str
    port: int
    access_key: str
    secret_key: str
    bucket: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    region: str = REGION

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> S3Client:
        return S3Client(self.host, self.port, self.access_key, self.secret_key, self.bucket, self.region)

    def url(self, path: str = "", scheme: str = "s3") -> str:
        """``s3://bucket/path`` (``scheme="s3a"`` for Spark)."""
        return f"{scheme}://{self.bucket}/{path.lstrip('/')}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs (deltalake 1.x) options for this server. Put-if-absent is delta-rs's default
        commit on S3 (no ``conditional_put`` and no locking provider needed)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def hadoop_conf(self, per_bucket: bool = False) -> dict[str, str]:
        """Spark conf for s3a on this server (``spark.hadoop.`` + the Hadoop key). With
        ``per_bucket``, S3A's per-bucket form (``fs.s3a.bucket.<bucket>.<option>``): it applies to
        this bucket only, so it can be set on a running session's Hadoop configuration beside other
        buckets. Secrets: ``fs.s3a.secret.key`` (and ``fs.s3a.access.key``, an identifier)."""
        options = {
            "endpoint": self.endpoint,
            "endpoint.region": self.region,
            "path.style.access": "true",
            "access.key": self.access_key,
            "secret.key": self.secret_key,
        }
        prefix = f"spark.hadoop.fs.s3a.bucket.{self.bucket}." if per_bucket else "spark.hadoop.fs.s3a."
        conf = {prefix + k: v for k, v in options.items()}
        # s3:// (as the warehouse is named) through the same connector
        conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        return conf

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _die_with_parent() -> None:
    """In the server's process before exec: end it when the process that started it ends
    (a killed test worker leaves no server behind). Linux only; elsewhere a no-op."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(base: Path, bucket: str | None = None, timeout: float = 30.0, access_log: Path | None = None) -> S3Server:
    """Start versitygw on a free port of 127.0.0.1 with its objects under ``base/s3-data``, create
    ``bucket`` (default ``warehouse-<random>``), and return once it answers. ``access_log``: a
    file that gets one line per request (bench/s3_costs.py counts them). Raises
    S3ServerMissing when the binary is not installed."""
    if not BINARY.exists():
        raise S3ServerMissing(
            f"{BINARY.relative_to(ROOT)} is missing: run scripts/fetch_s3_server.sh (scripts/setup.sh does)"
        )
    base.mkdir(parents=True, exist_ok=True)
    data_dir = base / "s3-data"
    data_dir.mkdir(exist_ok=True)
    port = _free_port()
    server = S3Server(
        host="127.0.0.1",
        port=port,
        access_key="test" + secrets.token_hex(6),
        secret_key=secrets.token_hex(20),
        bucket=bucket or f"warehouse-{secrets.token_hex(4)}",
        data_dir=data_dir,
        log_path=base / "versitygw.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VGW_", "ROOT_"))}
    env.update(ROOT_ACCESS_KEY=server.access_key, ROOT_SECRET_KEY=server.secret_key, VGW_REGION=server.region)
    with open(server.log_path, "wb") as log:
        server.proc = subprocess.Popen(
            [
                str(BINARY),
                "--quiet",
                "--port",
                f"127.0.0.1:{port}",
                *(["--access-log", str(access_log)] if access_log else []),
                "posix",
                str(data_dir),
            ],
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
            raise RuntimeError(f"versitygw exited with {server.proc.returncode}: see {server.log_path}")
        try:
            client.create_bucket(server.bucket)
            break
        except (ConnectionError, OSError):
            client.close()
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(
                    f"versitygw did not answer on port {port} within {timeout:.0f} s: see {server.log_path}"
                ) from None
            time.sleep(0.05)
    client.close()
    return server


@contextlib.contextmanager
def running(base: Path, bucket: str | None = None) -> Iterator[S3Server]:
    server = start(base, bucket)
    try:
        yield server
    finally:
        server.stop()
