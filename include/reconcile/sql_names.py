"""SQL names: an identifier quoted for each SQL dialect the sink writes (Spark, DuckDB, Trino).

Each function quotes one name and escapes the quote inside it, so any text is one identifier:
Spark doubles a backtick, DuckDB and Trino (standard SQL) double a double quote. Sink, column and
source names are plain names already (``reconcile.config`` checks them); the quoting keeps SQL
and column expressions correct for whatever name reaches them.
"""

from __future__ import annotations

from collections.abc import Callable


def spark_name(name: str) -> str:
    """``name`` as a Spark SQL identifier (also a ``F.col`` expression): ``a`b`` -> ```a``b```."""
    return "`" + name.replace("`", "``") + "`"


def spark_dotted(name: str) -> str:
    """A dotted name (``database.table``) as Spark SQL, each part quoted."""
    return ".".join(spark_name(part) for part in name.split("."))


def duckdb_name(name: str) -> str:
    """``name`` as a DuckDB identifier: ``a"b`` -> ``"a""b"``."""
    return '"' + name.replace('"', '""') + '"'


def trino_name(name: str) -> str:
    """``name`` as a Trino identifier: ``a"b`` -> ``"a""b"``."""
    return '"' + name.replace('"', '""') + '"'


QUOTE: dict[str, Callable[[str], str]] = {"spark": spark_name, "duckdb": duckdb_name, "trino": trino_name}


def quoter(dialect: str) -> Callable[[str], str]:
    """The function that quotes a name for ``dialect`` (``spark``, ``duckdb`` or ``trino``)."""
    try:
        return QUOTE[dialect]
    except KeyError:
        raise ValueError(f"unknown SQL dialect {dialect!r}: one of {', '.join(QUOTE)}") from None
