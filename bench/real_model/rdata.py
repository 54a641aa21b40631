"""A small reader for R's lazy-load databases (``data/Rdata.rdx`` + ``Rdata.rdb``), enough for character vectors.

An R package's data folder keeps each object as its own zlib stream in ``Rdata.rdb``: 4 bytes of big-endian
uncompressed length, then the stream. ``Rdata.rdx`` (gzip or the same framing) is a serialized R list whose
``variables`` entry names each object and its (offset, length) in the ``.rdb``. Both hold R's XDR serialization
(format 2 or 3, big-endian): every item starts with a flags word (type in the low byte, "has attributes" bit 9,
"has tag" bit 10). Only the types a data package of strings needs are read; anything else raises ValueError.
"""
from __future__ import annotations

import gzip
import struct
import zlib

NILVALUE, GLOBALENV, EMPTYENV, BASEENV, MISSINGARG, UNBOUNDVALUE = 254, 253, 242, 241, 251, 252
REFSXP = 255
SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19


class RObject:
    """A decoded R value: ``value`` (list / str / None) and its ``attrs`` {name: value}."""

    def __init__(self, value, attrs=None):
        self.value = value
        self.attrs = attrs or {}


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated R serialization")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def header(self) -> None:
        if self._take(2) != b"X\n":
            raise ValueError("not an R XDR serialization (expected 'X\\n')")
        version = self.int()
        self.int(), self.int()  # writer's and minimal reader's R versions
        if version == 3:
            self._take(self.int())  # native encoding name
        elif version != 2:
            raise ValueError(f"R serialization format {version} not supported")

    def _length(self) -> int:
        n = self.int()
        if n == -1:  # long vector: two more words
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind in (NILVALUE, GLOBALENV, EMPTYENV, BASEENV, MISSINGARG, UNBOUNDVALUE):
            return None
        if kind == REFSXP:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            name = self.item()
            self.refs.append(name)
            return name
        if kind == CHARSXP:
            n = self.int()
            return None if n == -1 else self._take(n).decode("utf-8", "replace")
        if kind == LISTSXP:  # pairlist: attributes, tag, car, cdr
            out = []
            while True:
                attrs = self.item() if has_attr else None
                tag = self.item() if has_tag else None
                del attrs
                out.append((tag, self.item()))
                flags = self.int()
                kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
                if kind == NILVALUE:
                    return out
                if kind != LISTSXP:
                    raise ValueError(f"pairlist continues with R type {kind}")
        if kind in (STRSXP, VECSXP):
            value = [self.item() for _ in range(self._length())]
        elif kind in (LGLSXP, INTSXP):
            n = self._length()
            value = list(struct.unpack(f">{n}i", self._take(4 * n)))
        elif kind == REALSXP:
            n = self._length()
            value = list(struct.unpack(f">{n}d", self._take(8 * n)))
        else:
            raise ValueError(f"R type {kind} not supported by this reader")
        attrs = dict(self.item()) if has_attr else {}
        return RObject(value, attrs)


def unserialize(data: bytes):
    """One serialized R value (XDR) -> RObject / str / list of (tag, value) pairs / None."""
    r = _Reader(data)
    r.header()
    return r.item()


def _unframe(blob: bytes) -> bytes:
    """A lazy-load record (4-byte big-endian length + zlib) or a gzip file -> its bytes."""
    if blob[:2] == b"\x1f\x8b":
        return gzip.decompress(blob)
    want = struct.unpack(">I", blob[:4])[0]
    out = zlib.decompress(blob[4:])
    if len(out) != want:
        raise ValueError(f"lazy-load record holds {len(out)} bytes, its header says {want}")
    return out


def read_lazyload(rdx: bytes, rdb: bytes) -> dict[str, object]:
    """The objects of an R lazy-load database: {name: RObject}."""
    index = unserialize(_unframe(rdx))
    names = index.attrs.get("names")
    if not isinstance(index, RObject) or names is None:
        raise ValueError("the .rdx index is not a named list")
    variables = index.value[names.value.index("variables")]
    out = {}
    for name, where in zip(variables.attrs["names"].value, variables.value):
        offset, length = where.value
        out[name] = unserialize(_unframe(rdb[offset:offset + length]))
    return out
