"""An independent model of an upsert sink, in plain Python (dicts), for the tests.

It replays what each run saw of the feed: a batch ``(lower, upper)`` applies the commands of its
feed snapshot with ``time < upper`` that no earlier batch applied (first batch: everything;
later: ``time >= lower``, or a ``time < lower`` with an offset above every offset an earlier
batch saw: late, applied at ``lower``). Per (key, effective time) the highest offset wins;
commands apply in time order; a null value (or delete marker) removes the key.

Below the model: the upsert sink and its feed as the tests write them, and the comparison of
the shard (read with delta-rs) with the model.
"""

from __future__ import annotations

from collections import Counter

from helpers import make_sink, shard_as_of, write_json_rows


class UpsertModel:
    def __init__(self, key: str = "k", value: str = "v", delete_field: str | None = None, delete_values=("d",)):
        self.key, self.value = key, value
        self.delete_field, self.delete_values = delete_field, set(delete_values)
        self.state: dict = {}  # key -> value
        self.history: list[tuple[int, dict]] = []  # (time, state after every command time)
        self.watermark: int | None = None
        self.late = 0

    def _is_delete(self, c: dict) -> bool:
        if self.delete_field:
            return str(c.get(self.delete_field)) in self.delete_values
        return c.get(self.value) is None

    def batch(self, feed: list[dict], lower: int, upper: int) -> None:
        chosen: dict[tuple, dict] = {}
        for c in feed:
            t, off = c["ts"], c["off"]
            if t >= upper:
                continue
            if self.watermark is not None and t < lower and off <= self.watermark:
                continue  # applied by an earlier batch
            if self.watermark is not None and t < lower:
                self.late += 1
            if c.get(self.key) is None:
                continue  # an error row, checked apart
            et = max(t, lower)
            best = chosen.get((c[self.key], et))
            if best is None or off > best["off"]:
                chosen[(c[self.key], et)] = c
        for (k, et), c in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if self._is_delete(c):
                self.state.pop(k, None)
            else:
                self.state[k] = c[self.value]
            self.history.append((et, dict(self.state)))
        offsets = [c["off"] for c in feed] + ([self.watermark] if self.watermark is not None else [])
        self.watermark = max(offsets) if offsets else None
        self.history.append((upper - 1, dict(self.state)))

    def as_of(self, t: int) -> Counter:
        """The model's collection as of t: Counter of (key, value, None)."""
        state: dict = {}
        for time, s in self.history:
            if time <= t:
                state = s
        return Counter({(k, v, None): 1 for k, v in state.items()})


UPSERT = {"source": {"format": "json", "path": "feed"}, "key": ["k"], "time_column": "ts", "offset_column": "off"}
HINT = {"k": 0, "v": "x", "ts": 10**15, "off": -1}  # a schema-only row far in the future, never eligible


def upsert_sink(tmp_path, name="ups", **kw):
    """An upsert sink reading the feed ``tmp_path/feed`` (key k, time ts, offset off)."""
    return make_sink(tmp_path, name, "upsert", upsert={**UPSERT, **kw.pop("upsert", {})}, **kw)


def cmd(k, v, ts, off, **extra):
    """One command of the feed."""
    return {"k": k, "v": v, "ts": ts, "off": off, **extra}


def feed_rows(tmp_path, rows):
    """Write the feed; a schema-only hint row keeps the columns when rows are few or empty."""
    write_json_rows(tmp_path / "feed", list(rows) + [HINT])


def ok_rows(counter: Counter) -> Counter:
    """The valid rows of a shard read as a multiset (error rows left out)."""
    return Counter({k: n for k, n in counter.items() if k[-1] is None})


def check_against(spark, cfg, model, times):
    """The shard's valid rows equal the model's collection at each of ``times``."""
    for t in times:
        assert ok_rows(shard_as_of(cfg, t)) == model.as_of(t), f"as of {t}"
