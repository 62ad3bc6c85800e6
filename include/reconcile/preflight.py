"""Preflight: what ``python -m reconcile validate`` checks that the config file alone cannot say.

A query sink's SQL is planned against its sources' schemas the way a run builds its desired
frame (:func:`reconcile.kinds.query.desired`): each source becomes a view, the SQL is refused if
it is a command, analysed, its result's columns compared with the sink's schema and their types
checked as the decoding casts them. All of it is analysis: no Spark job runs over the query or
the sources' rows (a JSON or CSV source's schema is inferred from its files, as in a run).

A problem is one :class:`~reconcile.errors.ConfigError` line naming the file and the field
(``query.sql``, or ``query.sources.NAME`` for a source that cannot be read), with Spark's own
reason and suggestion (``... `amt` cannot be resolved. Did you mean one of the following?
[`amount`, ...]``). The JVM's output (banner, warnings) goes to a log file, never to the
command's stderr; PySpark's error loggers are quiet while the SQL is analysed.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reconcile.config import SinkConfig
from reconcile.errors import ConfigError, SinkError, brief, shorten

_SOURCE = re.compile(r"cannot read source (query\.sources\.[A-Za-z0-9_]+) ")


@contextmanager
def jvm_output_to(log: Path) -> Iterator[None]:
    """Send what a JVM started inside the block writes to stderr to ``log``: the JVM keeps the
    stderr it was started with, this process gets its own back at the end of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


# A JVM that lives for one command: the C1 compiler only and the serial collector start it
# sooner (a 5-sink validate on a loaded 2-core machine: 26-29 s -> 16-18 s); Spark logs warnings only.
JAVA_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile=file:{log4j} -Dreconcile.spark.level=warn"
)


# A command's own JVM: Spark logs warnings only, to the command's log file.
QUIET_JAVA_OPTIONS = "-Dlog4j2.configurationFile=file:{log4j} -Dreconcile.spark.level=warn"


def quiet_session(app: str, log: Path, java_options: str = QUIET_JAVA_OPTIONS):
    """A Spark session named ``app`` whose JVM writes its banner and warnings to ``log``, not to
    this command's output: a Spark Connect client when ``RECONCILE_SPARK_REMOTE`` is set (no JVM
    here, and a driver's options are not a client's to set), else the active session, else a
    local one."""
    from reconcile import settings
    from reconcile.spark import LOG4J2_PROPERTIES, get_session

    if settings.spark_remote():
        return get_session(app)
    extra = {"spark.driver.extraJavaOptions": java_options.format(log4j=LOG4J2_PROPERTIES)}
    with jvm_output_to(log):
        return get_session(app, extra=extra)


def session(log: Path):
    """A Spark session for planning (:func:`quiet_session`, a JVM tuned to live briefly)."""
    return quiet_session("reconcile-validate", log, JAVA_OPTIONS)


def _one_line(exc: BaseException, cfg: SinkConfig) -> tuple[str, str]:
    """(field, message) of a refusal: the sink's message without its sink prefix and remedy,
    Spark's without the SQL state; shortened (:func:`~reconcile.errors.shorten`: long paths in
    their middle) to 500 characters, its cause kept."""
    text = exc.message if isinstance(exc, SinkError) else brief(exc, 500)
    text = shorten(re.sub(r" SQLSTATE: \w+;?", "", text).rstrip(" ;"), 500)
    found = _SOURCE.search(text)
    if found:
        return found.group(1), text
    return "query.sql", text.removeprefix("query.sql ")


def plan_query(spark, cfg: SinkConfig) -> ConfigError | None:
    """Plan the sink's SQL against its sources' schemas (no rows read); its problem, or None."""
    from reconcile import kinds
    from reconcile.kinds.decode import _quiet_analysis

    try:
        with _quiet_analysis():
            kinds.of(cfg).plan(spark)
    except Exception as exc:
        field, message = _one_line(exc, cfg)
        return ConfigError(cfg.path, field, message, sink=cfg.name)
    return None


def plan_queries(configs: list[SinkConfig]) -> dict[str, ConfigError | None]:
    """Each query sink's planning problem (None: planned) by sink name, in one Spark session;
    a :class:`~reconcile.errors.SinkError` if Spark does not start."""
    if not configs:
        return {}
    log = Path(tempfile.gettempdir()) / f"reconcile-validate-spark-{os.getuid()}-{os.getpid()}.log"
    try:
        spark = session(log)
    except Exception as exc:
        raise SinkError(
            f"Spark did not start, so no query sink's SQL was planned: {brief(exc)} (Spark's log: {log})",
            remedy="check Java and RECONCILE_SPARK_REMOTE, or skip the planning with `validate --no-spark`.",
        ) from None
    return {cfg.name: plan_query(spark, cfg) for cfg in configs}
