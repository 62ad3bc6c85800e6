"""Delta deletion vectors, written without a JVM: which rows of a data file a table no longer
holds, as the Delta protocol stores them (a 64-bit RoaringBitmap in its portable format behind a
magic number, in a ``deletion_vector_<uuid>.bin`` file beside the data, its descriptor in the
``add`` action). The current-state table marks retracted rows this way, so a batch's cost is its
retractions, not the files they fall in (:mod:`reconcile.sink.current`).

Only what the sink writes is encoded here: row positions below 2^32 (one 32-bit bitmap), array
and bitset containers (no run containers). :func:`decode` reads every container kind (a vector
another writer made has run containers too); :func:`read` fetches the sink's vectors by their
descriptors (a small read per vector file).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

MAGIC = 1681511377  # the protocol's RoaringBitmapArray format
FILE_FORMAT = 1  # the first byte of a deletion vector file
_NO_RUNS = 12346  # the portable format's cookie when no container is a run
_RUNS = 12347  # ... when some are (the low 16 bits; the high 16 hold the container count - 1)
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
    """Where an on-disk deletion vector's file is, relative to the table (``u``: its random
    prefix, the characters before the 20 of the UUID, as a directory, then the UUID's name;
    ``p``: an absolute path, as given)."""
    if descriptor["storageType"] == "p":
        return descriptor["pathOrInlineDv"]
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


def decode(data: bytes):
    """The row positions of a serialized deletion vector (magic number and 64-bit bitmap)."""
    import numpy as np

    magic, buckets = struct.unpack_from("<iQ", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic number {magic})")
    pos, parts = 12, []
    for _ in range(buckets):
        (high,) = struct.unpack_from("<I", data, pos)
        values, pos = _decode32(data, pos + 4)
        parts.append(values.astype(np.int64) + (int(high) << 32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _decode32(data: bytes, start: int):
    """One 32-bit portable RoaringBitmap at ``start``: (its values, the offset after it)."""
    import numpy as np

    (cookie,) = struct.unpack_from("<I", data, start)
    pos = start + 4
    if cookie & 0xFFFF == _RUNS:
        n = (cookie >> 16) + 1
        runs = np.unpackbits(np.frombuffer(data, np.uint8, (n + 7) // 8, pos), bitorder="little")[:n]
        pos += (n + 7) // 8
    elif cookie == _NO_RUNS:
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        runs = np.zeros(n, np.uint8)
    else:
        raise ValueError(f"not a portable RoaringBitmap (cookie {cookie})")
    head = np.frombuffer(data, "<u2", 2 * n, pos).reshape(n, 2)
    pos += 4 * n
    if cookie == _NO_RUNS or n >= 4:  # the offset header
        pos += 4 * n
    parts = []
    for (key, card_1), run in zip(head, runs, strict=True):
        base = int(key) << 16
        if run:
            (count,) = struct.unpack_from("<H", data, pos)
            pairs = np.frombuffer(data, "<u2", 2 * count, pos + 2).reshape(count, 2).astype(np.int64)
            pos += 2 + 4 * count
            parts += [np.arange(s, s + length + 1) + base for s, length in pairs]
        elif int(card_1) + 1 <= 4096:
            card = int(card_1) + 1
            parts.append(np.frombuffer(data, "<u2", card, pos).astype(np.int64) + base)
            pos += 2 * card
        else:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, pos), bitorder="little")
            parts.append(np.flatnonzero(bits).astype(np.int64) + base)
            pos += 8192
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), pos


def read(table_path: str, descriptors: dict[str, dict]) -> dict[str, Any]:
    """The deleted row positions of each data file (path -> sorted positions) from its deletion
    vector descriptor: one read per vector file, in parallel; each vector's size and checksum
    checked."""
    from concurrent.futures import ThreadPoolExecutor

    from reconcile.storage import files

    def load(name: str) -> bytes:  # relative to the table, or absolute (``p``)
        return files.read_bytes(name if "://" in name or name.startswith("/") else f"{table_path}/{name}")

    inline = {p: d for p, d in descriptors.items() if d["storageType"] == "i"}
    names = sorted({file_name(d) for p, d in descriptors.items() if p not in inline})
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        blobs = dict(zip(names, pool.map(load, names), strict=True))
    out: dict[str, Any] = {}
    for path, d in descriptors.items():
        if path in inline:
            out[path] = decode(unz85(d["pathOrInlineDv"])[: d["sizeInBytes"]])
            continue
        blob, off = blobs[file_name(d)], int(d.get("offset") or 1)
        (size,) = struct.unpack_from(">i", blob, off)
        data = blob[off + 4 : off + 4 + size]
        (crc,) = struct.unpack_from(">I", blob, off + 4 + size)
        if size != d["sizeInBytes"] or zlib.crc32(data) & 0xFFFFFFFF != crc:
            raise ValueError(f"deletion vector of {path} in {file_name(d)} is damaged (size or checksum)")
        out[path] = decode(data)
    return out


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
