"""Every source column type against every sink type (issue 17.4), property-based.

Hypothesis draws source schemas (the scalar types bigint, int, smallint, tinyint, double, float,
decimal(p,s), string, boolean, date, timestamp, timestamp_ntz and binary; struct, array and map)
with values, and sink schemas of the types a config allows. Each sink either

- decodes the source: every row becomes an ok row holding what the plain-Python model below says
  the cast gives, or an error row (all columns null, ``_error`` naming the column and the row);
  the ok and error rows together are exactly the source rows; or
- refuses it before anything runs, where the *type* is the problem (a struct for a bigint, a
  binary for a date, any pair Spark does not cast): one line naming the sink, the column, the
  source type and the sink type, nothing staged nor committed, no traceback.

The model is independent of the code under test: it knows Spark's casting rules (which pairs
cast, and how values convert) and the sink's own rules on top (an integral fraction, a finite
value that overflows to an infinity, a time outside years 1-9999 and bytes that are not UTF-8
for a string are errors). Most examples run the pure transforms on in-memory frames; some read
JSON and Parquet files; a few run whole batches, and the CLI's ``run`` prints one line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from helpers import assert_one_line, make_sink, run_stages, snapshot
from reconcile import cli
from reconcile.errors import SourceError
from reconcile.kinds import changelog, decode, query, upsert
from reconcile.storage import commits, files, frames
from reconcile.storage.delta import ShardTable

INT_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
FLOATS = ("float", "double")
DATETIME = ("date", "timestamp", "timestamp_ntz")
NUMERIC = (*INT_BITS, *FLOATS, "decimal")
SCALAR_KINDS = (*INT_BITS, *FLOATS, "decimal", "string", "boolean", *DATETIME, "binary")
NESTED_TYPES = ("struct<a:bigint,b:string>", "array<bigint>", "map<string,bigint>")
SINK_KINDS = ("boolean", *INT_BITS, *FLOATS, "decimal", "string", *DATETIME, "binary")

MIN_DAY, MAX_DAY = -719162, 2932896  # 0001-01-01 .. 9999-12-31
MIN_MICROS, MAX_MICROS = -62135596800000000, 253402300799999999
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY_MICROS = 86_400_000_000
TRUE_WORDS, FALSE_WORDS = ("t", "true", "y", "yes", "1"), ("f", "false", "n", "no", "0")
INFINITIES = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf}
INFINITIES.update({"-inf": -math.inf, "-infinity": -math.inf})
NUMBER_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
DATE_RE = re.compile(r"([+-]?\d{4,6})-(\d{2})-(\d{2})")
TS_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})([ T]\d{2}:\d{2}:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?")


def base(t: str) -> str:
    return "decimal" if t.startswith("decimal") else t


def precision_scale(t: str) -> tuple[int, int]:
    p, s = re.findall(r"\d+", t)
    return int(p), int(s)


# --- the model: which pairs Spark casts, and what a value becomes -------------------------------

CASTS = {  # source kind -> sink kinds Spark's try_cast accepts (strings cast both ways)
    **dict.fromkeys(NUMERIC, {"boolean", *NUMERIC, "timestamp"}),
    "boolean": {"boolean", *NUMERIC},
    "date": {"date", "timestamp", "timestamp_ntz"},
    "timestamp": {*NUMERIC, "date", "timestamp", "timestamp_ntz"},
    "timestamp_ntz": {"date", "timestamp", "timestamp_ntz"},
    "binary": {"binary"},
}


def refused(src: str, sink: str, counter: bool = False) -> bool:
    """Is the pair refused (a type problem)? ``counter``: a time, diff or offset column."""
    if src.startswith(("struct", "array", "map")):
        return True  # the sink's columns are scalars: Spark would print a struct as "{1, a}"
    if counter and src in DATETIME:
        return True  # a timestamp is not a number of epoch milliseconds
    if src == sink or "string" in (src, sink):
        return False
    return base(sink) not in CASTS[base(src)]


@dataclass(frozen=True)
class Exp:
    """What one value becomes: ``ok`` (``want`` the value, or a predicate of it), ``err`` (an
    error row), or ``any`` (the model does not know Spark's parser that well: either)."""

    kind: str
    want: object = None

    def matches(self, got) -> bool:
        if self.kind != "ok":
            return True
        if callable(self.want):
            return got is not None and bool(self.want(got))
        if isinstance(self.want, float) and isinstance(got, float):
            return (math.isnan(self.want) and math.isnan(got)) or self.want == got
        return type(got) is type(self.want) and got == self.want


ERR, ANY = Exp("err"), Exp("any")


def ok(value) -> Exp:
    return Exp("ok", value)


def near(value: float, rel: float) -> Exp:
    return Exp("ok", lambda g: math.isclose(g, value, rel_tol=rel, abs_tol=1e-300))


def f32(x: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def quantized(r: Decimal, p: int, s: int) -> Decimal | None:
    """``r`` rounded half up to ``s`` places, or None if it does not fit decimal(p, s)."""
    with localcontext() as ctx:  # exact: 38 digits are more than the default context's 28
        ctx.prec = 200
        if not r.is_finite() or abs(r) >= Decimal(10) ** (p - s + 1):
            return None
        q = r.quantize(Decimal(1).scaleb(-s), rounding=ROUND_HALF_UP)
        return q if abs(q) < Decimal(10) ** (p - s) else None


def ts_text(micros: int, sep: str = " ") -> str:
    """Spark's text of a timestamp: the fraction without trailing zeros."""
    t = EPOCH + timedelta(microseconds=micros)
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}{sep}{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    return text + (f".{t.microsecond:06d}".rstrip("0") if t.microsecond else "")


def day_text(days: int) -> str:
    d = date(1970, 1, 1) + timedelta(days=days)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}"


def junk(s: str, *, specials: tuple[str, ...] = ()) -> Exp:
    """A string no canonical form matched: with whitespace or control characters Spark may trim
    it (any); without any digit it is no number, date or time (err); else any."""
    if any(c.isspace() or ord(c) < 32 for c in s) or s.lower() in specials:
        return ANY
    return ERR if not any(c in "0123456789" for c in s) else ANY


def from_string(s: str, sink: str) -> Exp:
    k = base(sink)
    if k == "binary":
        return ok(s.encode())
    if k in INT_BITS:
        if re.fullmatch(r"[+-]?\d+", s, re.ASCII):
            n, bits = int(s), INT_BITS[k]
            return ok(n) if -(2 ** (bits - 1)) <= n < 2 ** (bits - 1) else ERR
        return ERR if NUMBER_RE.fullmatch(s) else junk(s)  # Spark reads no fraction or exponent
    if k in FLOATS:
        if s.lower() in INFINITIES:
            return ok(INFINITIES[s.lower()])
        if s.lower() == "nan":
            return ok(math.nan)
        if NUMBER_RE.fullmatch(s):
            d = float(s)
            v = d if k == "double" else f32(d)
            return ERR if math.isinf(v) else ok(v)  # a finite text that overflows
        return junk(s, specials=("nan", "infinity"))
    if k == "decimal":
        if NUMBER_RE.fullmatch(s):
            q = quantized(Decimal(s), *precision_scale(sink))
            return ERR if q is None else ok(q)
        return junk(s)
    if k == "boolean":
        low = s.lower()
        if low in TRUE_WORDS or low in FALSE_WORDS:
            return ok(low in TRUE_WORDS)
        return ANY if any(c.isspace() or ord(c) < 32 for c in s) else ERR
    if k == "date":
        m = DATE_RE.fullmatch(s)
        if m:
            y, mo, d = (int(g) for g in m.groups())
            try:
                return ok((date(y, mo, d) - date(1970, 1, 1)).days)
            except ValueError:
                return ERR  # month 13, year 0 or 10000: no date the sink holds
        return junk(s)
    if k in ("timestamp", "timestamp_ntz"):
        m = TS_RE.fullmatch(s)
        if m and (k == "timestamp" or not m.group(6)):
            try:
                t = datetime.fromisoformat(s)
            except ValueError:
                return ERR
            t = t if t.tzinfo else t.replace(tzinfo=UTC)
            micros = (t - EPOCH) // timedelta(microseconds=1)
            return ok(micros) if MIN_MICROS <= micros <= MAX_MICROS else ERR
        return junk(s)
    raise AssertionError(sink)


def to_string(src: str, v) -> Exp:
    k = base(src)
    if k in INT_BITS:
        return ok(str(v))
    if k == "boolean":
        return ok("true" if v else "false")
    if k == "decimal":
        with localcontext() as ctx:
            ctx.prec = 200
            q = v.quantize(Decimal(1).scaleb(-precision_scale(src)[1]))
        return ok(f"{abs(q) if q == 0 else q:f}")
    if k in FLOATS:
        if math.isnan(v):
            return ok("NaN")
        if math.isinf(v):
            return ok("Infinity" if v > 0 else "-Infinity")
        return Exp("ok", lambda g: (float(g) if k == "double" else f32(float(g))) == v)
    if k == "date":
        return ok(day_text(v))
    if k in ("timestamp", "timestamp_ntz"):
        return ok(ts_text(v))
    if k == "binary":
        try:
            return ok(v.decode("utf-8"))
        except UnicodeDecodeError:
            return ERR
    raise AssertionError(src)


def expect(src: str, v, sink: str) -> Exp:
    """What a non-null source value ``v`` (model form: days, micros, bytes, Decimal...) of type
    ``src`` becomes in a sink column of type ``sink`` (a pair that is not refused)."""
    k, s = base(sink), base(src)
    if src == sink:
        return ok(v)
    if s == "string":
        return from_string(v, sink)
    if k == "string":
        return to_string(src, v)
    exact: Fraction | None = None  # the source's value as a number (None: NaN or an infinity)
    if s in INT_BITS or s == "boolean":
        exact = Fraction(int(v))
    elif s == "decimal":
        exact = Fraction(v)
    elif s == "timestamp":
        exact = Fraction(v, 10**6)
    elif s in FLOATS and math.isfinite(v):
        exact = Fraction(v)
    if k in INT_BITS:
        if exact is None or exact.denominator != 1:
            return ERR  # NaN, an infinity, or a fraction that would be dropped
        bits = INT_BITS[k]
        return ok(int(exact)) if -(2 ** (bits - 1)) <= exact < 2 ** (bits - 1) else ERR
    if k in FLOATS:
        if s in FLOATS:
            w = v if k == "double" else f32(v)
            return ERR if math.isinf(w) and math.isfinite(v) else ok(w)
        if s in INT_BITS or s == "boolean":
            return ok(float(int(v))) if k == "double" else near(float(int(v)), 2**-23)
        if s == "timestamp":
            d = float(v) / 1e6
            return ok(d) if k == "double" else near(d, 2**-23)
        return near(float(v), 1e-15 if k == "double" else 2**-23)
    if k == "decimal":
        p, sc = precision_scale(sink)
        if s in FLOATS:
            if exact is None:
                return ERR
            shortest, binary = quantized(Decimal(repr(float(v))), p, sc), quantized(Decimal(float(v)), p, sc)
            if shortest is None and binary is None:
                return ERR
            return Exp("ok", lambda g: g in (shortest, binary))  # Java prints a double as repr does
        assert exact is not None
        with localcontext() as ctx:
            ctx.prec = 200
            q = quantized(Decimal(exact.numerator) / Decimal(exact.denominator), p, sc)
        return ERR if q is None else ok(q)
    if k == "boolean":
        return ok(bool(v)) if s in FLOATS else ok(exact != 0)
    if k == "date":  # from a timestamp (with or without a zone: UTC)
        return ok(v // DAY_MICROS)
    if k in ("timestamp", "timestamp_ntz"):
        if s == "date":
            return ok(v * DAY_MICROS)
        if s in ("timestamp", "timestamp_ntz"):
            return ok(v)
        if exact is None or not (MIN_MICROS <= exact * 10**6 <= MAX_MICROS):
            return ERR  # NaN, an infinity, or seconds outside years 1-9999
        micros = int(float(v) * 1e6) if s in FLOATS else int(exact * 10**6)
        return ok(micros) if MIN_MICROS <= micros <= MAX_MICROS else ERR
    raise AssertionError((src, sink))


# --- strategies: types and values ---------------------------------------------------------------

decimal_types = st.integers(1, 38).flatmap(lambda p: st.integers(0, min(p, 18)).map(lambda s: f"decimal({p},{s})"))


def concrete(kind: str) -> st.SearchStrategy[str]:
    return decimal_types if kind == "decimal" else st.just(kind)


source_types = st.sampled_from(SCALAR_KINDS).flatmap(concrete)
sink_types = st.sampled_from(SINK_KINDS).flatmap(concrete)
any_source_types = st.one_of(source_types, source_types, source_types, st.sampled_from(NESTED_TYPES))

doubles = st.one_of(
    st.floats(),
    st.sampled_from([1.5, -0.5, 2.0**63, -(2.0**63), 1e300, 1e17, 253402300800.0, 127.0, 1.0000000001, 1e-7]),
)
floats32 = st.one_of(st.floats(width=32), st.sampled_from([1.5, -0.5, 2.0**63, 3.0e38, 127.0, 0.1]).map(f32))
texts = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.integers(MIN_DAY, MAX_DAY).map(day_text),
    st.integers(MIN_MICROS, MAX_MICROS).map(ts_text),
    st.integers(MIN_MICROS, MAX_MICROS).map(lambda m: ts_text(m, "T") + "Z"),
    st.sampled_from(
        ["true", "FALSE", "yes", "n", "t", "0", "1", "nan", "-Infinity", "1e400", "1.0", "1e3", "10000-01-01"]
        + ["0000-01-01", "2020-02-30", "9999-12-31T23:59:59-01:00", "", "日本", " 12 ", "abc", "é"]
    ),
    st.text(max_size=6),
)


def values(t: str) -> st.SearchStrategy:
    """Model-form values of type ``t`` (days for a date, micros for timestamps, bytes...)."""
    k = base(t)
    if k in INT_BITS:
        bits = INT_BITS[k]
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if k == "double":
        return doubles
    if k == "float":
        return floats32
    if k == "decimal":
        p, s = precision_scale(t)
        return st.integers(-(10**p) + 1, 10**p - 1).map(lambda n: Decimal(f"{n}E-{s}"))  # exact: no context
    if k == "string":
        return texts
    if k == "boolean":
        return st.booleans()
    if k == "date":
        return st.one_of(st.integers(MIN_DAY, MAX_DAY), st.sampled_from([MIN_DAY, MAX_DAY, 0, -1]))
    if k in ("timestamp", "timestamp_ntz"):
        edges = [MIN_MICROS, MAX_MICROS, 0, -1, 1_500_000, 86_400_000_000]
        return st.one_of(st.integers(MIN_MICROS, MAX_MICROS), st.sampled_from(edges))
    if k == "binary":
        return st.one_of(st.binary(max_size=6), st.sampled_from([b"\xff", "日本".encode()]))
    if t.startswith("struct"):
        return st.tuples(st.integers(-5, 5), st.text(max_size=3) | st.none())
    if t.startswith("array"):
        return st.lists(st.integers(-5, 5), max_size=3)
    if t.startswith("map"):
        return st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2)
    raise AssertionError(t)


def to_spark(t: str, v):
    """A model value as createDataFrame takes it."""
    if v is None:
        return None
    k = base(t)
    if k == "date":
        return date(1970, 1, 1) + timedelta(days=v)
    if k == "timestamp":
        return EPOCH + timedelta(microseconds=v)
    if k == "timestamp_ntz":
        return (EPOCH + timedelta(microseconds=v)).replace(tzinfo=None)
    if k == "binary":
        return bytearray(v)
    return v


def normalized(cfg) -> list:
    """The sink's columns as the model writes values: days, micros, bytes."""
    out = []
    for c in cfg.columns:
        col = F.col(f"`{c.name}`")
        if c.type == "date":
            col = F.unix_date(col)
        elif c.type == "timestamp":
            col = F.unix_micros(col)
        elif c.type == "timestamp_ntz":
            col = F.unix_micros(col.cast("timestamp"))  # the session's zone is UTC
        out.append(col.alias(c.name))
    return out


@dataclass
class Case:
    """Columns ``c0..`` of (source type, sink type, nullable) and rows of model values; every
    sink also has ``id`` (bigint, never null), which an error row's message carries."""

    columns: list[tuple[str, str, bool]]
    rows: list[list]

    @property
    def names(self) -> list[str]:
        return [f"c{i}" for i in range(len(self.columns))]

    def schema(self) -> list[dict]:
        cols = [{"name": "id", "type": "bigint", "nullable": False}]
        return cols + [{"name": n, "type": k, "nullable": null} for n, (_, k, null) in zip(self.names, self.columns)]

    def ddl(self) -> str:
        return ", ".join(["id bigint", *(f"{n} {s}" for n, (s, _, _) in zip(self.names, self.columns))])

    def spark_rows(self) -> list[tuple]:
        return [(i, *(to_spark(s, v) for (s, _, _), v in zip(self.columns, row))) for i, row in enumerate(self.rows)]


def sink_types_for(src: str, castable: bool | None) -> st.SearchStrategy[str]:
    """Sink types for a source type: any, only those it casts to, or only those refused."""
    kinds = [
        k for k in SINK_KINDS if castable is None or refused(src, k if k != "decimal" else "decimal(38,0)") != castable
    ]
    return st.sampled_from(kinds).flatmap(concrete)


REFUSABLE = [s for s in (*SCALAR_KINDS, *NESTED_TYPES) if s != "string"]  # each has a sink type it cannot become


@st.composite
def cases(
    draw,
    sources=any_source_types,
    castable: bool | None = None,
    max_columns: int = 3,
    min_rows: int = 0,
    max_rows: int = 4,
) -> Case:
    """``castable``: every column casts (True), at least one is refused (False), or either."""
    n = draw(st.integers(1, max_columns))
    cols = []
    for _ in range(n):
        src = draw(sources if castable is None else source_types)  # a scalar casts to something
        cols.append((src, draw(sink_types_for(src, True if castable is False else castable)), draw(st.booleans())))
    if castable is False:  # one refused column, anywhere
        src = draw(st.sampled_from(REFUSABLE).flatmap(concrete))
        cols.insert(draw(st.integers(0, n)), (src, draw(sink_types_for(src, False)), draw(st.booleans())))
    rows = [[draw(st.none() | values(s)) for s, _, _ in cols] for _ in range(draw(st.integers(min_rows, max_rows)))]
    return Case(cols, rows)


@st.composite
def wide_cases(draw, max_sources: int = 2, max_rows: int = 6) -> Case:
    """One or two scalar source types, each into every sink type it casts to (a column each)."""
    cols = []
    for src in draw(st.lists(source_types, min_size=1, max_size=max_sources)):
        for kind in SINK_KINDS:
            sink = draw(concrete(kind))
            if not refused(src, sink):
                cols.append((src, sink, draw(st.booleans())))
    rows = [[draw(st.none() | values(s)) for s, _, _ in cols] for _ in range(draw(st.integers(1, max_rows)))]
    return Case(cols, rows)


# --- checking an outcome against the model --------------------------------------------------------


def first_refused(case: Case) -> int | None:
    return next((i for i, (s, k, _) in enumerate(case.columns) if refused(s, k)), None)


def assert_refusal(exc: SourceError, cfg, case: Case, i: int) -> None:
    src, sink, _ = case.columns[i]
    text = assert_one_line(exc, cfg.name)
    assert f"column '{case.names[i]}' is {src}, which cannot become the sink's type {sink}" in text, text
    assert "Traceback" not in text and "Py4J" not in text


def assert_decoded(out_rows: list, cfg, case: Case) -> None:
    """Each source row is once in ``out_rows``: an ok row as the model says, or an error row."""
    assert len(out_rows) == len(case.rows), (len(out_rows), len(case.rows))
    seen: set[int] = set()
    for r in out_rows:
        d = r.asDict()
        error = d["_error"]
        if error is None:
            i = d["id"]
        else:
            found = re.search(r'"id":"(\d+)"', error)
            assert found, error
            i = int(found.group(1))
            assert all(d[n] is None for n in ["id", *case.names]), d
        assert i not in seen and 0 <= i < len(case.rows), (i, seen)
        seen.add(i)
        exps = []
        for (s, k, nullable), v in zip(case.columns, case.rows[i]):
            if v is None:
                exps.append(ok(None) if nullable else ERR)
            else:
                exps.append(expect(s, v, k))
                event(f"value {base(s)} -> {base(k)}: {exps[-1].kind}")
        where = f"row {case.rows[i]} of {case.columns}: {d}"
        if error is None:
            assert all(e.kind != "err" for e in exps), f"an ok row the model says is an error: {where}"
            for n, e in zip(case.names, exps):
                got = d[n]
                got = bytes(got) if isinstance(got, bytearray) else got
                if e.kind == "ok" and e.want is None:
                    assert got is None, where
                else:
                    assert got is not None and e.matches(got), f"column {n}: {got!r} is not {e.want!r}: {where}"
        else:
            assert any(e.kind != "ok" for e in exps), f"an error row the model says is ok: {where}"
            for n, e in zip(case.names, exps):
                if e.kind == "err":
                    assert f"column '{n}'" in error, (n, error)
            named = [n for n in case.names if f"column '{n}'" in error]
            assert named and all(exps[case.names.index(n)].kind != "ok" for n in named), (named, where)


def decode_rows(cfg, df) -> list:
    return (
        decode.validate(cfg, df, "the result of query.sql", F.lit(1), None)
        .select(*normalized(cfg), "_error", "_diff")
        .collect()
    )


SESSION = {"n": 0}


def new_name(prefix: str) -> str:
    SESSION["n"] += 1
    return f"{prefix}_{SESSION['n']}"


def query_sink(directory: Path, case: Case, name: str, fmt: str = "json"):
    sql = f"SELECT {', '.join(['id', *case.names])} FROM src"
    query_cfg = {"sources": {"src": {"format": fmt, "path": f"src_{name}"}}, "sql": sql}
    return make_sink(directory, name, schema=case.schema(), query=query_cfg, as_of=0)


@pytest.fixture(scope="module")
def sinks_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("source-types")


@pytest.fixture(scope="module", autouse=True)
def utc_session(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


# --- 1. typed sources, in memory (Parquet's and Delta's types) ------------------------------------


# Values the sink took before issue 17.4 although they do not fit (each an ok row holding
# something else), beside values of the same pairs that do fit.
MISFITS = Case(
    [
        ("double", "tinyint", True),  # 1.0000000001 became 1: decimal(38,9) rounded the fraction away
        ("decimal(20,10)", "bigint", True),  # the same, from a decimal of scale 10
        ("double", "bigint", True),  # 2^63 became 2^63 - 1 (Spark saturates; it reads back as 2^63)
        ("double", "float", True),  # 1e300 became Infinity
        ("string", "double", True),  # '1e400' became Infinity
        ("bigint", "timestamp", True),  # 2^63 - 1 seconds saturated to the year 294247
        ("decimal(38,0)", "timestamp", True),  # 1e17 seconds wrapped around to the year 8319
        ("string", "date", True),  # '10000-01-01': a date no other reader holds
        ("string", "timestamp", True),  # after 9999-12-31T23:59:59.999999Z
        ("binary", "string", True),  # b'\xff' became a string that is not UTF-8
    ],
    [
        [1.0000000001, Decimal("1.0000000001"), 2.0**63, 1e300, "1e400", 2**63 - 1, Decimal(10**17)]
        + ["10000-01-01", "9999-12-31T23:59:59-01:00", b"\xff"],
        [3.0, Decimal("2.0000000000"), -(2.0**63), 1.5, "-1e3", 253402300799, Decimal(-62135596800)]
        + ["9999-12-31", "9999-12-31T23:59:59.999999Z", "日本".encode()],
    ],
)


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
@settings(max_examples=25, deadline=None)
@given(case=wide_cases())
@example(case=MISFITS)
def test_typed_values_decode_as_the_model_says(spark, sinks_dir, case):
    cfg = query_sink(sinks_dir, case, new_name("typed"))
    df = spark.createDataFrame(case.spark_rows(), case.ddl())
    rows = decode_rows(cfg, df)
    assert all(r["_diff"] == 1 for r in rows)
    assert_decoded(rows, cfg, case)


@settings(max_examples=40, deadline=None)
@given(case=cases(castable=False, max_columns=3, max_rows=2))
def test_a_type_that_cannot_become_the_sinks_is_refused_in_one_line(spark, sinks_dir, case):
    cfg = query_sink(sinks_dir, case, new_name("refused"))
    df = spark.createDataFrame(case.spark_rows(), case.ddl())
    bad = first_refused(case)
    assert bad is not None
    event(f"refused {base(case.columns[bad][0])} -> {base(case.columns[bad][1])}")
    with pytest.raises(SourceError) as info:
        decode.validate(cfg, df, "the result of query.sql", F.lit(1), None)
    assert_refusal(info.value, cfg, case, bad)


@pytest.mark.parametrize("ansi", ["true", "false"])
@settings(max_examples=6, deadline=None)
@given(case=cases(sources=st.sampled_from([*NESTED_TYPES, "binary", "date", "timestamp", "boolean"]), max_rows=2))
def test_refusals_do_not_depend_on_ansi_mode(spark, sinks_dir, ansi, case):
    cfg = query_sink(sinks_dir, case, new_name("ansi"))
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", ansi)
    try:
        df = spark.createDataFrame(case.spark_rows(), case.ddl())
        bad = first_refused(case)
        try:
            rows = decode_rows(cfg, df)
        except SourceError as exc:
            assert bad is not None, str(exc)
            assert_refusal(exc, cfg, case, bad)
            return
        assert bad is None
        assert_decoded(rows, cfg, case)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)


# --- 2. JSON and Parquet files, read by the sink's own reader --------------------------------------

JSON_KINDS = {  # what a JSON value's column infers to in Spark, and the values of that kind
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False, allow_infinity=False),
    "string": texts,
    "boolean": st.booleans(),
    "struct<a:bigint,b:string>": values("struct<a:bigint,b:string>"),
    "array<bigint>": st.lists(st.integers(-5, 5), min_size=1, max_size=3),  # [] alone infers array<string>
}
ARROW = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "smallint": pa.int16(),
    "tinyint": pa.int8(),
    "double": pa.float64(),
    "float": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "binary": pa.binary(),
    "struct<a:bigint,b:string>": pa.struct([("a", pa.int64()), ("b", pa.string())]),
    "array<bigint>": pa.list_(pa.int64()),
    "map<string,bigint>": pa.map_(pa.string(), pa.int64()),
}


def arrow_type(t: str) -> pa.DataType:
    return pa.decimal128(*precision_scale(t)) if t.startswith("decimal") else ARROW[t]


def to_arrow(t: str, v):
    if v is None:
        return None
    if t.startswith("struct"):
        return {"a": v[0], "b": v[1]}
    if t.startswith("map"):
        return list(v.items())
    if base(t) == "binary":
        return bytes(v)
    return to_spark(t, v)


def to_json_value(t: str, v):
    return {"a": v[0], "b": v[1]} if v is not None and t.startswith("struct") else v


@st.composite
def file_cases(draw) -> tuple[str, Case]:
    fmt = draw(st.sampled_from(["json", "parquet"]))
    if fmt == "json":
        sources = st.sampled_from(list(JSON_KINDS))
        case = draw(cases(sources=sources, max_columns=3, min_rows=1, max_rows=4))
        rows = [
            [None if v is None else draw(JSON_KINDS[s]) for (s, _, _), v in zip(case.columns, r)] for r in case.rows
        ]
        case = Case(case.columns, rows)
    else:
        case = draw(cases(max_columns=4, min_rows=1, max_rows=4))
    return fmt, case


def write_source(directory: Path, fmt: str, case: Case) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        with open(directory / "part-0.json", "w") as f:
            for i, row in enumerate(case.rows):
                record = {"id": i, **{n: to_json_value(s, v) for n, (s, _, _), v in zip(case.names, case.columns, row)}}
                f.write(json.dumps(record) + "\n")
        return
    arrays = {"id": pa.array(range(len(case.rows)), pa.int64())}
    for j, (n, (s, _, _)) in enumerate(zip(case.names, case.columns)):
        arrays[n] = pa.array([to_arrow(s, r[j]) for r in case.rows], arrow_type(s))
    pq.write_table(pa.table(arrays), directory / "part-0.parquet")


@settings(max_examples=12, deadline=None)
@given(drawn=file_cases())
def test_json_and_parquet_sources_decode_or_are_refused(spark, sinks_dir, drawn):
    fmt, case = drawn
    name = new_name(fmt)
    write_source(sinks_dir / f"src_{name}", fmt, case)
    cfg = query_sink(sinks_dir, case, name, fmt)
    raw = decode.read_source(spark, cfg, cfg.sources[0], "query.sources.src")
    inferred = {f.name: f.dataType.simpleString() for f in raw.schema.fields}
    for n, (s, _, _), vals in zip(case.names, case.columns, zip(*case.rows) if case.rows else [()] * len(case.names)):
        if fmt == "parquet" or any(v is not None for v in vals):
            assert inferred[n] == s, (n, inferred, case.columns)  # the reader's type is the drawn one
        else:  # a JSON column with no value infers as string
            assert inferred[n] == "string", inferred
    real = Case([(inferred[n], k, null) for n, (_, k, null) in zip(case.names, case.columns)], case.rows)
    bad = first_refused(real)
    try:
        desired = query.desired(spark, cfg)
        rows = desired.select(*normalized(cfg), "_error", "_diff").collect()
    except SourceError as exc:
        assert bad is not None, f"refused a source that casts: {exc}"
        assert_refusal(exc, cfg, real, bad)
        return
    assert bad is None, f"decoded a source whose column {real.columns[bad]} is refused"
    assert_decoded(rows, cfg, real)


# --- 3. a change log's time and diff, an upsert feed's time, offset and values ------------------

counter_types = st.one_of(
    st.sampled_from(["bigint", "int", "double", "string", *DATETIME, "boolean"]), any_source_types
)


@settings(max_examples=12, deadline=None)
@given(time_type=counter_types, diff_type=counter_types, value_type=any_source_types, n=st.integers(0, 3))
def test_changelog_and_upsert_counters_are_numbers_or_refused(spark, sinks_dir, time_type, diff_type, value_type, n):
    name = new_name("log")
    case = Case([(value_type, "string", True)], [[None] for _ in range(n)])
    log_cfg = make_sink(
        sinks_dir,
        name,
        kind="changelog",
        schema=case.schema(),
        changelog={"source": {"format": "json", "path": "log"}, "time_column": "ts", "diff_column": "diff"},
    )
    ddl = f"id bigint, c0 {value_type}, ts {time_type}, diff {diff_type}"
    df = spark.createDataFrame([(i, None, None, None) for i in range(n)], ddl)
    order = [
        ("c0", value_type, "string", False),
        ("ts", time_type, "bigint", True),
        ("diff", diff_type, "bigint", True),
    ]
    bad = next((o for o in order if refused(o[1], o[2], counter=o[3])), None)
    try:
        rows = changelog.decode(log_cfg, df).collect()
    except SourceError as exc:
        assert bad is not None, str(exc)
        text = assert_one_line(exc, log_cfg.name)
        assert f"column '{bad[0]}' is {bad[1]}, which cannot become the sink's type {bad[2]}" in text, text
    else:
        assert bad is None, f"decoded {bad}"
        assert len(rows) == n and all(r["_error"] and "time column 'ts'" in r["_error"] for r in rows)

    up_cfg = make_sink(
        sinks_dir,
        name + "_up",
        kind="upsert",
        schema=case.schema(),
        upsert={
            "source": {"format": "json", "path": "feed"},
            "key": ["id"],
            "time_column": "ts",
            "offset_column": "diff",
        },
    )
    try:
        feed = upsert.check_feed(up_cfg, df)
        cmds = upsert.commands(up_cfg, feed, 0, 1000, None).collect()
    except SourceError as exc:
        assert bad is not None, str(exc)
        text = assert_one_line(exc, up_cfg.name)
        assert f"column '{bad[0]}' is {bad[1]}" in text and bad[2] in text, text
    else:
        assert bad is None, f"decoded {bad}"
        assert len(cmds) == n and all(r["_unkeyed"] for r in cmds)  # no time, no offset


# --- 4. whole batches: refused with nothing committed, or every row stored -------------------------


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases(max_columns=2, max_rows=3))
@example(
    case=Case([("double", "bigint", False), ("string", "date", True)], [[1.5, "2020-01-01"], [2.0, "x"], [None, None]])
)
def test_a_batch_commits_every_row_or_nothing(spark, warehouse, tmp_path, sqlite_ledger, case):
    name = new_name("batch")
    write_source(tmp_path / f"src_{name}", "parquet", case)
    cfg = query_sink(tmp_path, case, name, "parquet")
    ShardTable(cfg).ensure()
    before = snapshot(spark, sqlite_ledger, cfg)
    bad = first_refused(case)
    try:
        _, w, a = run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    except SourceError as exc:
        assert bad is not None, str(exc)
        assert_refusal(exc, cfg, case, bad)
        after = snapshot(spark, sqlite_ledger, cfg)
        assert after.upper == cfg.as_of == 0  # mint made the shard's row; nothing moved it
        assert (after.version, after.commits, after.committed) == (before.version, (), ())
        assert files.list_dirs(ShardTable(cfg).staging_root) in ([], [b.batch_id for b in sqlite_ledger.batches(name)])
        return
    assert bad is None
    assert a is not None and a.outcome == "committed", a
    assert w is not None and w.rows_ok + w.rows_err == len(case.rows)
    shard = frames.read_updates(spark, ShardTable(cfg)).where(F.col("_time") <= 199)
    rows = shard.select(*normalized(cfg), "_error", "_diff").collect()
    assert all(r["_diff"] == 1 for r in rows)
    assert_decoded(rows, cfg, case)


CLI_CASES = {  # name: (format, source columns as written, sink type of c0, the source type Spark sees)
    "struct_for_bigint": ("json", [{"id": 1, "c0": {"a": 1, "b": "x"}}], "bigint", "struct<a:bigint,b:string>"),
    "array_for_string": ("json", [{"id": 1, "c0": [1, 2]}], "string", "array<bigint>"),
    "binary_for_date": ("parquet", pa.table({"id": [1], "c0": pa.array([b"\x00"], pa.binary())}), "date", "binary"),
    "date_for_int": ("parquet", pa.table({"id": [1], "c0": pa.array([date(2020, 1, 1)])}), "int", "date"),
    "map_for_double": (
        "parquet",
        pa.table({"id": [1], "c0": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))}),
        "double",
        "map<string,bigint>",
    ),
}


@pytest.mark.parametrize("which", list(CLI_CASES))
def test_cli_run_prints_one_line_and_commits_nothing(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capfd, which
):
    fmt, data, sink_type, source_type = CLI_CASES[which]
    src = tmp_path / "src"
    src.mkdir()
    if fmt == "json":
        (src / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in data))
    else:
        pq.write_table(data, src / "part-0.parquet")
    name = f"cli_{which}"
    schema = [{"name": "id", "type": "bigint", "nullable": False}, {"name": "c0", "type": sink_type}]
    query_cfg = {"sources": {"src": {"format": fmt, "path": "src"}}, "sql": "SELECT id, c0 FROM src"}
    cfg = make_sink(tmp_path, name, schema=schema, query=query_cfg, as_of=0)
    ShardTable(cfg).ensure()
    version = ShardTable(cfg).latest_version()
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    capfd.readouterr()
    assert cli.main(["run", name, "--frontier", "200"]) == 2
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    text = lines[0]
    assert text.startswith(f"error: sink '{name}': the result of query.sql: column 'c0' is {source_type}, "), text
    assert f"which cannot become the sink's type {sink_type}" in text and "Remedy:" in text, text
    assert "Traceback" not in out + err and "Py4J" not in out + err and "Exception" not in out + err
    assert sqlite_ledger.get_shard(name).upper == 0  # the batch was never appended
    assert (
        ShardTable(cfg).latest_version() == version
        and commits.batch_commits(ShardTable(cfg).history_since(-1)[1]) == []
    )
    assert files.list_dirs(ShardTable(cfg).staging_root) in ([], [b.batch_id for b in sqlite_ledger.batches(name)])
    for b in sqlite_ledger.batches(name):
        assert files.list_files(ShardTable(cfg).staging_path(b.batch_id)) == {}
