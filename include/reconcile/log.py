"""One-line structured log events: every line carries the whole state (sink, frontiers, batch);
and the times they and every output show (:func:`iso`), read back from a command line (:func:`parse_time`).

``event(log, "appended batch", sink=..., lower=..., upper=...)`` logs
``appended batch | sink=orders lower=10 upper=20``: an on-call engineer reads one line and knows
where the shard stands; the same fields go to ``extra`` for structured handlers.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from reconcile.errors import SinkError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Fields that hold times (epoch ms): printed as ISO UTC with the ms value beside it.
TIME_FIELDS = frozenset({"lower", "upper", "since", "as_of", "shard_upper", "old_upper", "frontier", "new_since"})


def iso(ms: int | None) -> str:
    """``2026-11-24T09:00:00.000Z (1795510800000)``: a time (epoch ms) as every output shows it."""
    if ms is None:
        return "-"
    try:
        text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{text} ({ms})"


def parse_time(text: str | int, what: str = "time") -> int:
    """Epoch milliseconds from an integer or an ISO-8601 timestamp (naive: UTC)."""
    if isinstance(text, int):
        return text
    s = text.strip()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise SinkError(f"{what} {text!r} is neither epoch milliseconds nor an ISO-8601 timestamp") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def _field(key: str, value: Any) -> str:
    if key in TIME_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return f"{key}={iso(value)}"
    return f"{key}={value}"


def fmt(message: str, **state: Any) -> str:
    fields = " ".join(_field(k, v) for k, v in state.items() if v is not None)
    return f"{message} | {fields}" if fields else message


def event(logger: logging.Logger, message: str, **state: Any) -> str:
    """Log ``message`` with the state at ``level`` (a keyword among the state; default INFO)."""
    level = int(state.pop("level", logging.INFO))
    line = fmt(message, **state)
    logger.log(level, line, extra={"reconcile": state})
    return line
