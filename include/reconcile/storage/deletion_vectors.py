"""Delta deletion vectors, written without a JVM: which rows of a data file a table no longer
holds, as the Delta protocol stores them (a 64-bit RoaringBitmap in its portable format behind a
magic number, in a ``deletion_vector_<uuid>.bin`` file beside the data, its descriptor in the
``add`` action). The current-state table marks retracted rows this way, so a batch's cost is its
retractions, not the files they fall in (:mod:`reconcile.sink.current`).

Only what the sink writes is encoded here: row positions below 2^32 (one 32-bit bitmap), array
and bitset containers (no run containers). Reading goes through delta-rs
(:func:`deleted_rows`), whose kernel decodes every form.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

MAGIC = 1681511377  # the protocol's RoaringBitmapArray format
FILE_FORMAT = 1  # the first byte of a deletion vector file
_NO_RUNS = 12346  # the portable format's cookie when no container is a run
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """ZeroMQ's Base85 (the protocol's encoding of a deletion vector file's UUID)."""
    if len(data) % 4:
        raise ValueError("z85 encodes whole 4-byte words")
    out: list[str] = []
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i : i + 4], "big")
        word = []
        for _ in range(5):
            n, r = divmod(n, 85)
            word.append(_Z85[r])
        out.extend(reversed(word))
    return "".join(out)


def unz85(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for ch in text[i : i + 5]:
            n = n * 85 + _Z85.index(ch)
        out += n.to_bytes(4, "big")
    return bytes(out)


def file_name(descriptor: dict) -> str:
    """Where an on-disk (``u``) deletion vector's file is, relative to the table: its random
    prefix (the characters before the 20 of the UUID) as a directory, then the UUID's name."""
    code = descriptor["pathOrInlineDv"]
    prefix, u = code[:-20], uuid.UUID(bytes=unz85(code[-20:]))
    return f"{prefix}/deletion_vector_{u}.bin" if prefix else f"deletion_vector_{u}.bin"


def encode(positions) -> bytes:
    """The protocol's serialized bitmap of row ``positions`` (any integer array, < 2^32)."""
    import numpy as np

    values = np.unique(np.asarray(positions, dtype=np.int64))
    if len(values) and (values[0] < 0 or values[-1] >= 1 << 32):
        raise ValueError("a row position is outside 0..2^32-1")
    values = values.astype(np.uint32)
    keys, starts, counts = np.unique(values >> 16, return_index=True, return_counts=True)
    lows = (values & 0xFFFF).astype("<u2")
    bodies = []
    for start, count in zip(starts, counts, strict=True):
        part = lows[start : start + count]
        if count <= 4096:  # an array container: the sorted low halves
            bodies.append(part.tobytes())
        else:  # a bitset container: 2^16 bits, little-endian 64-bit words
            bits = np.zeros(1 << 16, dtype=bool)
            bits[part] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    n = len(keys)
    head = struct.pack("<II", _NO_RUNS, n) + b"".join(
        struct.pack("<HH", int(k), int(c) - 1) for k, c in zip(keys, counts, strict=True)
    )
    offset = len(head) + 4 * n
    offsets = []
    for body in bodies:
        offsets.append(offset)
        offset += len(body)
    bitmap32 = head + struct.pack(f"<{n}I", *offsets) + b"".join(bodies)
    # the 64-bit wrapper: how many 32-bit bitmaps, then each with its high 32 bits (0)
    return struct.pack("<iQI", MAGIC, 1, 0) + bitmap32


def write_file(table_path: str, vectors: dict[str, Any]) -> dict[str, dict]:
    """One deletion vector file at the table's root holding a vector per data file
    (``vectors``: path relative to the table -> its deleted row positions, all of them); returns
    each data file's descriptor for its ``add`` action."""
    import numpy as np

    from reconcile.storage import files

    u = uuid.uuid4()
    body = bytearray([FILE_FORMAT])
    out: dict[str, dict] = {}
    for path, positions in vectors.items():
        data = encode(positions)
        out[path] = {
            "storageType": "u",
            "pathOrInlineDv": z85(u.bytes),
            "offset": len(body),
            "sizeInBytes": len(data),
            "cardinality": int(len(np.unique(np.asarray(positions)))),
        }
        body += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data) & 0xFFFFFFFF)
    files.write_bytes(f"{table_path}/deletion_vector_{u}.bin", bytes(body))
    return out


def unique_id(dv: dict | None) -> str | None:
    """The protocol's identity of a deletion vector (a logical file is its path and this)."""
    if not dv:
        return None
    off = dv.get("offset")
    return f"{dv['storageType']}{dv['pathOrInlineDv']}" + (f"@{off}" if off is not None else "")


def deleted_rows(dt, table_uri: str) -> dict[str, Any]:
    """The deleted row positions of every data file of the snapshot ``dt`` that has a deletion
    vector (path relative to the table -> sorted positions), decoded by delta-rs."""
    from urllib.parse import unquote

    import numpy as np
    import pyarrow as pa

    out: dict[str, Any] = {}
    root = table_uri.rstrip("/") + "/"
    vectors = pa.table(dt.deletion_vectors().read_all()).combine_chunks()
    if not vectors.num_rows:
        return out
    keep = vectors.column("selection_vector").chunk(0)
    offsets = keep.offsets.to_numpy()
    flat = keep.values.to_numpy(zero_copy_only=False)
    for i, uri in enumerate(vectors.column("filepath").to_pylist()):
        rel = unquote(uri[len(root) :] if uri.startswith(root) else uri.rsplit("/", 1)[-1])
        out[rel] = np.flatnonzero(~flat[offsets[i] : offsets[i + 1]])
    return out
