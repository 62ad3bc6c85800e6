"""Environment-driven settings. Read lazily (never at import time of a DAG file)."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# A source tree (a checkout, the image's /opt/airflow) holds include/reconcile/ beside jobs/,
# include/sinks/ and .jars/. An installed wheel has no such tree: its root is the package, which
# carries jobs/ (pyproject.toml), and the state defaults to $AIRFLOW_HOME/reconcile/.
SOURCE_TREE = _PACKAGE.parent.name == "include"
PROJECT_ROOT = _PACKAGE.parents[1] if SOURCE_TREE else _PACKAGE


def home() -> Path:
    """Root of the embedded default's state (metadata DB, warehouse): RECONCILE_HOME, else
    .reconcile/ in a source tree, else reconcile/ in Airflow's home (an installed wheel)."""
    if os.environ.get("RECONCILE_HOME"):
        return Path(os.environ["RECONCILE_HOME"])
    if SOURCE_TREE:
        return PROJECT_ROOT / ".reconcile"
    return Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser() / "reconcile"


def metadata_url() -> str:
    url = os.environ.get("RECONCILE_METADATA_URL")
    if url:
        return url
    path = home() / "metadata.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def warehouse() -> str:
    """Root under which each sink's Delta table and staged batches live (a path or URI)."""
    root = os.environ.get("RECONCILE_WAREHOUSE")
    if root:
        return root.rstrip("/")
    path = home() / "warehouse"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


# The object stores a warehouse can be on, by URI scheme: S3 (``s3a://`` is Spark's name for it),
# Azure Data Lake Storage Gen2 (``abfss://container@account.dfs.core.windows.net/...`` as Spark's
# ABFS connector names it; ``az://container/...`` as delta-rs and Arrow also take it, the account
# from AZURE_STORAGE_ACCOUNT_NAME) and Google Cloud Storage.
STORE_SCHEMES = {"s3": ("s3://", "s3a://"), "azure": ("abfss://", "abfs://", "az://"), "gcs": ("gs://",)}
OBJECT_STORE_SCHEMES = tuple(scheme for schemes in STORE_SCHEMES.values() for scheme in schemes)


def store_of(path: str) -> str | None:
    """The object store ``path`` is on ("s3", "azure", "gcs"), None for a local path."""
    return next((store for store, schemes in STORE_SCHEMES.items() if path.startswith(schemes)), None)


def on_object_store(path: str) -> bool:
    """Is ``path`` on an object store (S3, ADLS, GCS) rather than a local disk?"""
    return store_of(path) is not None


def s3_endpoint() -> str | None:
    """An S3-compatible endpoint other than AWS's (``AWS_ENDPOINT_URL``), None on AWS."""
    return os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or None


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def azure_location(path: str) -> tuple[str | None, str, str | None]:
    """(storage account, ``container/key`` inside it, the account's dfs host) of an Azure URI:
    ``abfss://container@account.dfs.core.windows.net/key`` names its account and host;
    ``az://container/key`` takes the account from AZURE_STORAGE_ACCOUNT_NAME (None if unset)."""
    scheme, _, rest = path.partition("://")
    authority, _, key = rest.partition("/")
    if scheme in ("abfs", "abfss") and "@" in authority:
        container, _, host = authority.partition("@")
        return host.split(".", 1)[0], f"{container}/{key}".rstrip("/"), host
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or None
    return account, rest.rstrip("/"), f"{account}.dfs.core.windows.net" if account else None


def azure_endpoint() -> str | None:
    """The Blob endpoint of an Azure-compatible store other than Azure's own
    (``AZURE_STORAGE_ENDPOINT``, as delta-rs names it; an emulator's is path-style,
    ``http://127.0.0.1:10000/<account>``), None on Azure."""
    return os.environ.get("AZURE_STORAGE_ENDPOINT") or None


def metastore() -> str:
    """The Hive metastore the sink registers its tables in (``RECONCILE_METASTORE``):
    ``embedded`` (the default: Derby in RECONCILE_HOME, one Spark process at a time),
    ``thrift://host:9083`` (a metastore service, over its own database), or ``none``."""
    return os.environ.get("RECONCILE_METASTORE", "embedded").strip() or "embedded"


def metastore_conf() -> dict[str, str]:
    """Spark conf that backs the session catalog with :func:`metastore` (static: set when the
    session starts); empty for ``none``."""
    where = metastore()
    if where == "none":
        return {}
    conf = {"spark.sql.catalogImplementation": "hive"}
    if where == "embedded":
        db = home() / "metastore_db"
        conf.update(
            {
                "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={db};create=true",
                "spark.sql.warehouse.dir": str(home() / "spark-warehouse"),
                "spark.hadoop.derby.system.home": str(home()),
                # Derby serves one process: while another holds it, fail at once (2-3 s) rather
                # than after the metastore client's retries (44 s a write)
                "spark.hadoop.hive.hmshandler.retry.attempts": "1",
                "spark.hadoop.hive.hmshandler.retry.interval": "0",
                "spark.hadoop.hive.metastore.failure.retries": "0",
            }
        )
    elif where.startswith("thrift://"):
        conf["spark.hadoop.hive.metastore.uris"] = where
    else:
        from reconcile.errors import SinkError

        raise SinkError(
            f"RECONCILE_METASTORE={where!r} is not a metastore",
            remedy="set it to embedded, none or thrift://host:port (docs/configuration.md).",
        )
    return conf


def delta_storage_options() -> dict[str, str]:
    """What delta-rs needs beyond the standard environment variables it reads itself (AWS_*,
    AZURE_*, GOOGLE_*): plain HTTP allowed to an endpoint that speaks it. The credentials stay in
    the environment: never in an option, a log line or the ledger."""
    options = {}
    endpoint = s3_endpoint()
    if endpoint and endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    endpoint = azure_endpoint()
    if endpoint and endpoint.startswith("http://"):
        options["AZURE_ALLOW_HTTP"] = "true"
    return options


def spark_store_conf() -> dict[str, str]:
    """Hadoop conf for the warehouse's object store (set as ``spark.hadoop.<key>`` on a new
    session, as ``<key>`` at runtime). S3: ``s3://`` through S3A, the endpoint and region off AWS;
    S3A reads the credentials from the standard AWS environment variables (or the machine's role).
    ADLS and GCS (when the warehouse is there): see :func:`_abfs_conf` and :func:`_gcs_conf`.
    Never a secret: at most a ``${env.NAME}`` reference that Hadoop resolves in the JVM."""
    conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = s3_endpoint()
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    region = s3_region()
    if region:
        conf["fs.s3a.endpoint.region"] = region
    root = os.environ.get("RECONCILE_WAREHOUSE", "")
    store = store_of(root)
    if store == "azure":
        conf.update(_abfs_conf(root))
    elif store == "gcs":
        conf.update(_gcs_conf())
    return conf


def _abfs_conf(root: str) -> dict[str, str]:
    """ABFS (hadoop-azure) auth for the warehouse's account, from the standard Azure variables.
    ABFS reads no environment variable itself, so the conf names them as ``${env.NAME}``, which
    Hadoop's Configuration resolves from the JVM's environment when ABFS reads the key: the
    secret never enters the conf. First that applies: the account key (SharedKey), workload
    identity (AKS: AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE), a service
    principal's secret (AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_CLIENT_SECRET); none: what the
    deployment configures itself (a managed identity, a Hadoop credential provider)."""
    _, _, host = azure_location(root)
    if not host:
        return {}
    env = os.environ

    def oauth(provider: str, more: dict[str, str]) -> dict[str, str]:
        """An OAuth provider of hadoop-azure for the application AZURE_CLIENT_ID, and ``more``."""
        return {
            "auth.type": "OAuth",
            "oauth.provider.type": f"org.apache.hadoop.fs.azurebfs.oauth2.{provider}",
            "oauth2.client.id": "${env.AZURE_CLIENT_ID}",
            **more,
        }

    if env.get("AZURE_STORAGE_ACCOUNT_KEY"):
        conf = {"auth.type": "SharedKey", "key": "${env.AZURE_STORAGE_ACCOUNT_KEY}"}
    elif all(env.get(k) for k in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE")):
        conf = oauth(
            "WorkloadIdentityTokenProvider",
            {"oauth2.msi.tenant": "${env.AZURE_TENANT_ID}", "oauth2.token.file": "${env.AZURE_FEDERATED_TOKEN_FILE}"},
        )
    elif all(env.get(k) for k in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET")):
        endpoint = "https://login.microsoftonline.com/${env.AZURE_TENANT_ID}/oauth2/token"
        conf = oauth(
            "ClientCredsTokenProvider",
            {"oauth2.client.secret": "${env.AZURE_CLIENT_SECRET}", "oauth2.client.endpoint": endpoint},
        )
    else:
        return {}
    return {f"fs.azure.account.{k}.{host}": v for k, v in conf.items()}


def _gcs_conf() -> dict[str, str]:
    """The GCS connector (gcs-connector 3.x) for ``gs://``, authenticated by Google's Application
    Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, else the machine's service account)."""
    return {
        "fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        "fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
        "fs.gs.auth.type": "APPLICATION_DEFAULT",
    }


def commit_lease_seconds() -> float:
    """How long a writer's commit lease on a shard lasts past its last fence
    (``RECONCILE_COMMIT_LEASE_SECONDS``, default 30): the longest stall tolerated between the
    fence and the put of a commit file, and the longest a crashed writer blocks the next commit."""
    raw = os.environ.get("RECONCILE_COMMIT_LEASE_SECONDS", "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        from reconcile.errors import SinkError

        raise SinkError(
            f"RECONCILE_COMMIT_LEASE_SECONDS={raw!r} is not a positive number of seconds",
            remedy="set it to one (or unset it: 30 s); nothing was committed.",
        )
    return seconds


def sinks_dir() -> Path:
    """RECONCILE_SINKS_DIR, else include/sinks/ in a source tree, else sinks/ in :func:`home`."""
    if os.environ.get("RECONCILE_SINKS_DIR"):
        return Path(os.environ["RECONCILE_SINKS_DIR"])
    return PROJECT_ROOT / "include" / "sinks" if SOURCE_TREE else home() / "sinks"


def spark_master() -> str:
    return os.environ.get("RECONCILE_SPARK_MASTER", "local[*]")


def spark_remote() -> str | None:
    """A Spark Connect server's URL (``sc://host:port``): Spark jobs run as its clients, in this
    process, instead of starting a JVM of their own (None: classic Spark)."""
    return os.environ.get("RECONCILE_SPARK_REMOTE") or None


def spark_jars() -> list[str]:
    """Delta's JVM artifacts as local jar paths: RECONCILE_SPARK_JARS (comma-separated jars or
    folders of jars), else .jars/ of a source tree (scripts/fetch_jars.sh); none: Spark fetches
    DELTA_PACKAGES from Maven Central."""
    env = os.environ.get("RECONCILE_SPARK_JARS")
    entries = [j for j in env.split(",") if j] if env else [str(PROJECT_ROOT / ".jars")] if SOURCE_TREE else []
    jars: list[str] = []
    for entry in entries:
        if Path(entry).is_dir():
            jars += sorted(str(p) for p in Path(entry).glob("*.jar"))
        elif env:
            jars.append(entry)
    return jars


DELTA_PACKAGES = "io.delta:delta-spark_2.13:4.4.0"


# Airflow's own ledger database on SQLite (the embedded default, scripts/env.sh): the
# scheduler, the dag-processor and a CLI command write at once, and sqlite3's 5 s wait for a
# lock is too short on a busy 2-core machine ("database is locked"). Named by
# AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS; never used with PostgreSQL.
AIRFLOW_SQLITE_CONNECT_ARGS = {"timeout": 60}
