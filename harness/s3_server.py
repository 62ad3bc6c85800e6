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
import os
import secrets
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from harness.emulator_server import ROOT, Emulator, EmulatorMissing, Request, SignedClient, data_dir
from harness.emulator_server import running as running_server

BINARY = ROOT / ".tools" / "versitygw"
REGION = "us-east-1"


class S3ServerMissing(EmulatorMissing):
    pass


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


@dataclass
class S3Client(SignedClient):
    """A minimal path-style S3 client (AWS Signature V4, stdlib only): bucket creation and what
    :class:`~emulator_server.SignedClient` requests."""

    host: str
    port: int
    access_key: str
    secret_key: str
    bucket: str
    region: str = REGION
    list_query: ClassVar[dict[str, str]] = {"list-type": "2"}  # ListObjectsV2
    list_marker = ("continuation-token", "NextContinuationToken")
    list_entry = ("Contents", "Key")

    def signed(self, req: Request) -> tuple[str, dict[str, str]]:
        path = "/" + urllib.parse.quote(self.bucket)
        if req.target:
            path += "/" + urllib.parse.quote(req.target, safe="/~")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted(req.query.items())
        )
        now = dt.datetime.now(dt.UTC)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(req.body).hexdigest()
        hdrs = {"host": f"{self.host}:{self.port}", "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
        hdrs.update(req.headers)
        signed = sorted(hdrs)
        canonical = "\n".join(
            [
                req.method,
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

    def create_store(self) -> None:
        """CreateBucket of the client's bucket."""
        self.expect(f"CreateBucket {self.bucket}", (200,), "PUT")


@dataclass(kw_only=True)
class S3Server(Emulator):
    access_key: str
    secret_key: str
    bucket: str
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


def start(base: Path, bucket: str | None = None, timeout: float = 30.0, access_log: Path | None = None) -> S3Server:
    """Start versitygw on a free port of 127.0.0.1 with its objects under ``base/s3-data``, create
    ``bucket`` (default ``warehouse-<random>``), and return once it answers. ``access_log``: a
    file that gets one line per request (bench/s3_costs.py counts them). Raises
    S3ServerMissing when the binary is not installed."""
    server = S3Server(
        access_key="test" + secrets.token_hex(6),
        secret_key=secrets.token_hex(20),
        bucket=bucket or f"warehouse-{secrets.token_hex(4)}",
        data_dir=data_dir(base, "s3-data", BINARY, "fetch_s3_server.sh", S3ServerMissing),
        log_path=base / "versitygw.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VGW_", "ROOT_"))}
    env.update(ROOT_ACCESS_KEY=server.access_key, ROOT_SECRET_KEY=server.secret_key, VGW_REGION=server.region)
    command = [
        str(BINARY),
        "--quiet",
        "--port",
        f"{server.host}:{server.port}",
        *(["--access-log", str(access_log)] if access_log else []),
        "posix",
        str(server.data_dir),
    ]
    server.launch("versitygw", command, env, timeout)
    return server


def running(base: Path, bucket: str | None = None) -> contextlib.AbstractContextManager[S3Server]:
    """:func:`start`, stopped when the block ends."""
    return running_server(start(base, bucket))
