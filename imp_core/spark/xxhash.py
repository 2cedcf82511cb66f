"""Spark's ``xxhash64`` of key columns, computed in the driver.

A state table is partitioned by ``pmod(xxhash64(keys), buckets)`` (``state_store``). A batch's fetch needs its keys'
buckets as literals to prune the table's partitions; computing them here costs microseconds where a Spark job costs a
few hundred milliseconds per fetch. The values are Spark's exactly (``XxHash64Function``, seed 42): per column, a
non-NULL value is hashed with the running hash as its seed (an integer, date or boolean as four bytes, a long as
eight, a string as its UTF-8 bytes; NULL leaves the hash as it was). Other key types return None and the caller asks
Spark. Checked against Spark in ``tests/spark/test_xxhash.py``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

SEED = 42
_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                                   0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))
_M64 = (1 << 64) - 1
_INT = (pl.Int8, pl.Int16, pl.Int32, pl.Date, pl.Boolean)  # hashed as Spark's hashInt
_LONG = (pl.Int64,)  # hashLong


def supported(dtype: pl.DataType) -> bool:
    """Whether :func:`xxhash64` computes Spark's hash for a column of ``dtype``."""
    return dtype in _INT or dtype in _LONG or dtype == pl.String


def xxhash64(df: pl.DataFrame) -> np.ndarray | None:
    """Spark's ``xxhash64`` over the columns of ``df`` in order (int64 per row), or None when a column's type is not
    :func:`supported`."""
    if not all(supported(t) for t in df.dtypes):
        return None
    h = np.full(df.height, SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in df.iter_columns():
            valid = ~col.is_null().to_numpy()
            if col.dtype == pl.String:
                hashed = np.array([_bytes(v.encode(), int(s)) if v is not None else 0
                                   for v, s in zip(col.to_list(), h.tolist(), strict=True)], dtype=np.uint64)
            else:
                values = col.to_physical().cast(pl.Int64).fill_null(0).to_numpy().astype(np.int64)
                hashed = _int(values, h) if col.dtype in _INT else _long(values, h)
            h = np.where(valid, hashed, h)
    return h.view(np.int64)


def buckets(df: pl.DataFrame, count: int) -> list[int] | None:
    """The distinct ``pmod(xxhash64(columns), count)`` of the rows of ``df``, sorted (None: a type Spark must hash)."""
    h = xxhash64(df)
    if h is None:
        return None
    return sorted(set(np.mod(h, count).tolist()))  # numpy's modulo of a negative by a positive is Spark's pmod


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(4)
    h = h ^ ((values.astype(np.uint64) & np.uint64(0xFFFFFFFF)) * _P1)
    return _avalanche(_rotl(h, 23) * _P2 + _P3)


def _long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(8)
    k = _rotl(values.astype(np.uint64) * _P2, 31) * _P1
    return _avalanche(_rotl(h ^ k, 27) * _P1 + _P4)


def _bytes(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` (Spark's ``hashUnsafeBytes``), in Python integers."""
    p1, p2, p3, p4, p5 = (int(p) for p in (_P1, _P2, _P3, _P4, _P5))

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (64 - r))) & _M64

    def round_(acc: int, lane: int) -> int:
        return (rotl((acc + lane * p2) & _M64, 31) * p1) & _M64

    n, i = len(data), 0
    if n >= 32:
        v = [(seed + p1 + p2) & _M64, (seed + p2) & _M64, seed, (seed - p1) & _M64]
        while i + 32 <= n:
            for j in range(4):
                v[j] = round_(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & _M64
        for lane in v:
            h = (((h ^ round_(0, lane)) * p1) + p4) & _M64
    else:
        h = (seed + p5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        h = (rotl(h ^ round_(0, int.from_bytes(data[i:i + 8], "little")), 27) * p1 + p4) & _M64
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ ((int.from_bytes(data[i:i + 4], "little") * p1) & _M64), 23) * p2 + p3) & _M64
        i += 4
    while i < n:
        h = (rotl(h ^ ((data[i] * p5) & _M64), 11) * p1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * p2) & _M64
    h ^= h >> 29
    h = (h * p3) & _M64
    return h ^ (h >> 32)


__all__ = ["buckets", "supported", "xxhash64"]
