"""What reading a shard's files and log costs on S3, in requests (the S3 server's access log):
a listing of a tree is one flat listing, not one per directory; ``check``'s pass over the log
reads each commit file once, however many of its parts look at it; and the answers are the
same as on a local disk. No JVM.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from helpers import make_sink
from reconcile.storage import files
from reconcile.storage.delta import ShardTable

TREE = {
    "batches/b1/s1/part-0.parquet": b"x" * 3,
    "batches/b1/s1/_SUCCESS": b"",
    "batches/b1/s2/part-0.parquet": b"y" * 5,
    "batches/b2/s3/p=1/part-1.parquet": b"z" * 7,
    "_delta_log/00000000000000000000.json": b"{}",
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory, monkeypatch_module):
    from harness import s3_server

    base = tmp_path_factory.mktemp("s3-listing")
    try:
        server = s3_server.start(base, access_log=base / "access.log")
    except s3_server.S3ServerMissing as exc:
        pytest.skip(str(exc))
    for k, v in server.storage_options().items():
        monkeypatch_module.setenv(k, v)
    yield server, base / "access.log"
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


class Requests:
    """The requests the server answered since the last :meth:`take`, by operation."""

    def __init__(self, log: Path):
        self.log = log
        self.seen = 0

    def take(self) -> Counter:
        import time

        time.sleep(0.3)  # a request's line is written once it was answered
        lines = self.log.read_text().splitlines()
        new, self.seen = lines[self.seen :], len(lines)
        return Counter(next(w for w in ln.split() if w.startswith("s3_")) for ln in new if " s3_" in ln)


def _local_tree(root: Path) -> str:
    for key, body in TREE.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)
    (root / "batches" / "b3").mkdir()  # an empty staging directory (a local disk keeps it)
    return str(root)


def test_a_tree_on_s3_is_listed_in_one_request_as_on_a_local_disk(s3, tmp_path):
    s3, log = s3
    client = s3.client()
    for key, body in TREE.items():
        client.put(f"tree/{key}", body)
    requests = Requests(log)
    requests.take()
    on_s3 = {
        "files": files.list_files(s3.url("tree")),
        "dirs": files.list_dirs(s3.url("tree/batches")),
        "subdirs": files.list_subdirs(s3.url("tree/batches")),
    }
    assert requests.take() == Counter({"s3_ListObjectsV2": 3})  # one each, no HEAD per entry
    local = _local_tree(tmp_path)
    on_disk = {
        "files": files.list_files(local),
        "dirs": files.list_dirs(f"{local}/batches"),
        "subdirs": files.list_subdirs(f"{local}/batches"),
    }
    want_files = {k: len(v) for k, v in TREE.items() if not k.endswith("_SUCCESS")}
    assert on_s3["files"] == on_disk["files"] == want_files
    assert on_s3["dirs"] == ["b1", "b2"] and on_disk["dirs"] == ["b1", "b2", "b3"]
    assert on_s3["subdirs"] == {"b1": ["s1", "s2"], "b2": ["s3"]}
    assert on_disk["subdirs"] == {"b1": ["s1", "s2"], "b2": ["s3"], "b3": []}
    assert files.list_files(s3.url("nothing-here")) == {} == files.list_subdirs(s3.url("nothing-here"))


def test_a_pass_over_the_log_reads_each_commit_file_once(s3, tmp_path):
    s3, log = s3
    import pyarrow as pa
    from deltalake import write_deltalake

    cfg = make_sink(tmp_path, "log_once")
    table = ShardTable(cfg, warehouse=s3.url("wh"))
    for i in range(12):  # 12 versions written by delta-rs (foreign to the sink: drift)
        write_deltalake(table.path, pa.table({"k": [i], "v": [str(i)]}), mode="append")
    requests = Requests(log)
    requests.take()

    table.remember_commits()
    latest, entries = table.log_entries(-1)
    foreign = table.foreign_commits(-1, latest)
    reads = requests.take()
    assert latest == 11 and [v for v, _, _ in entries] == list(range(12))
    assert [f.version for f in foreign] == list(range(12))  # each added rows behind the sink
    assert reads["s3_GetObject"] == 12  # each commit file once, though both read all of them

    fresh = ShardTable(cfg, warehouse=s3.url("wh"))  # a stage's table reads what it is asked
    fresh.log_entries(-1)
    fresh.log_entries(-1)
    assert requests.take()["s3_GetObject"] == 24
