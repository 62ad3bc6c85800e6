"""A real S3 API server for the tests: S3Proxy on 127.0.0.1, storing objects in a temp folder.

Why S3Proxy (docs/object-stores.md): Apache-2.0, one jar from Maven Central (no build), starts in
about a second, and its filesystem store answers ``PutObject`` with ``If-None-Match: *`` by
publishing the object with link(2), which fails if the key exists: concurrent put-if-absent of one
key has exactly one winner (tests/test_s3_store.py measures it). ``If-Match`` (a named ETag) is a
read followed by a write there, not atomic; delta-rs only uses ``If-None-Match: *``.

``scripts/fetch_s3_server.sh`` (run by scripts/setup.sh) puts the jar in ``.tools/``. Use::

    with s3_server.running(tmp_path) as s3:      # or s3 = s3_server.start(tmp_path); s3.stop()
        s3.storage_options()                     # for delta-rs (deltalake)
        s3.hadoop_conf()                         # for Spark through s3a (spark.hadoop.fs.s3a.*)
        s3.client().put("k", b"v", if_none_match="*")

The credentials are random per server; ``secret_key`` is the value a no-secret-in-logs test greps
for.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import http.client
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
S3PROXY_VERSION = "4.0.0"
JAR = ROOT / ".tools" / f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"
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

    def request(
        self,
        method: str,
        key: str | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        bucket: str | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        bucket = self.bucket if bucket is None else bucket
        path = "/" + urllib.parse.quote(bucket) + ("/" + urllib.parse.quote(key, safe="/~") if key else "")
        query = query or {}
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}" for k, v in sorted(query.items())
        )
        now = dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        hdrs = {"host": f"{self.host}:{self.port}", "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
        hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
        signed = sorted(hdrs)
        canonical = "\n".join(
            [method, path, canonical_query, *(f"{h}:{hdrs[h].strip()}" for h in signed), "", ";".join(signed), payload_hash]
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
        url = path + (f"?{canonical_query}" if canonical_query else "")
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

    def hadoop_conf(self) -> dict[str, str]:
        """Spark conf for s3a on this server (``spark.hadoop.`` + the Hadoop key). The secret is in
        ``fs.s3a.secret.key`` (and the key id in ``fs.s3a.access.key``)."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        }

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise S3ServerMissing("java is not on PATH: S3Proxy needs Java 17+")
    return java


def start(base: Path, bucket: str = "warehouse", timeout: float = 60.0) -> S3Server:
    """Start S3Proxy on a free port of 127.0.0.1 with its objects under ``base/s3-data``, create
    ``bucket``, and return once it answers. Raises S3ServerMissing when the jar is not installed."""
    if not JAR.exists():
        raise S3ServerMissing(f"{JAR.relative_to(ROOT)} is missing: run scripts/fetch_s3_server.sh (scripts/setup.sh does)")
    base.mkdir(parents=True, exist_ok=True)
    data_dir = base / "s3-data"
    data_dir.mkdir(exist_ok=True)
    port = _free_port()
    server = S3Server(
        host="127.0.0.1",
        port=port,
        access_key="test-" + secrets.token_hex(4),
        secret_key=secrets.token_hex(20),
        bucket=bucket,
        data_dir=data_dir,
        log_path=base / "s3proxy.log",
    )
    conf = base / "s3proxy.conf"
    conf.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint=http://127.0.0.1:{port}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={server.access_key}",
                f"s3proxy.credential={server.secret_key}",
                "jclouds.provider=filesystem-nio2",
                f"jclouds.filesystem.basedir={data_dir}",
                "",
            ]
        )
    )
    conf.chmod(0o600)
    # A small heap and the quick JIT: it serves a few small objects per test.
    env = {k: v for k, v in os.environ.items() if k not in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS")}
    env["LOG_LEVEL"] = "warn"
    env["JETTY_LOG_LEVEL"] = "warn"
    with open(server.log_path, "wb") as log:
        server.proc = subprocess.Popen(
            [_java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar", str(JAR), "--properties", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    client = server.client()
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"S3Proxy exited with {server.proc.returncode}: see {server.log_path}")
        try:
            client.create_bucket(bucket)
            break
        except (ConnectionError, OSError):
            client.close()
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"S3Proxy did not answer on port {port} within {timeout:.0f} s: see {server.log_path}") from None
            time.sleep(0.1)
    client.close()
    return server


@contextlib.contextmanager
def running(base: Path, bucket: str = "warehouse") -> Iterator[S3Server]:
    server = start(base, bucket)
    try:
        yield server
    finally:
        server.stop()
