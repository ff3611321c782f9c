#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpus of tests/fuzz/fuzz_protocol.c into tests/fuzz/corpus/ (deterministic).

Each seed is the harness's flags byte (bit 0: authenticated prelude, session and space 1 of 64
pages already open; bit 1: Unix socket; bits 2-4: chunked feeding) followed by protocol frames
(docs/protocol.md)."""
import struct
import zlib
from pathlib import Path

MAGIC = 0x31444D46
OUT = Path(__file__).resolve().parent / "corpus"


def frame(op, payload=b"", count=0, req=1, magic=MAGIC, length=None):
    return struct.pack("<IHHQII", magic, op, 0, req, count, len(payload) if length is None else length) + payload


def ref(space=1):
    return struct.pack("<II", space, 0)


def page(i):
    return bytes((i * 31 + k) & 0xFF for k in range(4096))


def crc32c(b):
    # Not the real CRC32C: the fuzzer finds both the accepted and the refused paths.
    return zlib.crc32(b)


def seeds():
    hello = frame(1, struct.pack("<HHI", 1, 1, 0) + bytes(32))
    yield "hello", b"\x00" + hello
    yield "hello_badver", b"\x00" + frame(1, struct.pack("<HHI", 9, 9, 0) + bytes(32))
    yield "auth_bad", b"\x00" + hello + frame(2, bytes(32))
    yield "badmagic", b"\x00" + frame(1, bytes(40), magic=0xDEADBEEF)
    yield "toolong", b"\x00" + frame(1, b"", length=0xFFFFFFF0)
    yield "stats", b"\x01" + frame(10)
    yield "space_open", b"\x01" + frame(5, struct.pack("<QII", 128, 0, 0))
    yield "space_close", b"\x01" + frame(6, ref(1))
    yield "read", b"\x01" + frame(7, ref(1) + struct.pack("<3Q", 0, 1, 63), count=3)
    yield "read_range", b"\x01" + frame(7, ref(1) + struct.pack("<Q", 1 << 40), count=1)
    p0, p1 = page(0), page(1)
    ents = struct.pack("<QII", 0, crc32c(p0), 0) + struct.pack("<QII", 5, crc32c(p1), 0)
    yield "write", b"\x01" + frame(8, ref(1) + ents + p0 + p1, count=2)
    yield "write_read", b"\x05" + frame(8, ref(1) + ents + p0 + p1, count=2) + \
        frame(7, ref(1) + struct.pack("<2Q", 0, 5), count=2, req=2)
    yield "discard", b"\x01" + frame(9, ref(1) + struct.pack("<QQ", 0, 64), count=1)
    yield "quota", b"\x03" + frame(12, struct.pack("<qQ", 16, 0))
    yield "shm_map", b"\x03" + frame(11, ref(1))
    yield "join_bad", b"\x01" + frame(4, struct.pack("<Q", 1) + bytes(16))
    yield "unknown_op", b"\x01" + frame(999) + frame(10, req=3)
    yield "pipeline", b"\x09" + b"".join(frame(10, req=i) for i in range(8))
    # COPY (op 14): within space 1, into a second space, out of range, a space of no one, bad count.
    def copy(src, dst, pairs, count=None, req=1):
        body = struct.pack("<II", src, dst) + b"".join(struct.pack("<QQ", a, b) for a, b in pairs)
        return frame(14, body, count=len(pairs) if count is None else count, req=req)
    yield "copy", b"\x01" + frame(8, ref(1) + ents + p0 + p1, count=2) + \
        copy(1, 1, [(0, 3), (3, 4), (5, 5), (9, 0)], req=2) + frame(7, ref(1) + struct.pack("<2Q", 3, 4), count=2, req=3)
    yield "copy_two_spaces", b"\x01" + frame(5, struct.pack("<QII", 4, 0, 0)) + \
        frame(8, ref(1) + ents + p0 + p1, count=2, req=2) + copy(1, 2, [(0, 0), (5, 3), (5, 4)], req=3)
    yield "copy_range", b"\x01" + copy(1, 1, [(1 << 40, 0), (0, (1 << 64) - 1), (15, 16)])
    yield "copy_foreign", b"\x01" + copy(1, 7, [(0, 0)]) + copy(9, 1, [(0, 0)], req=2)
    yield "copy_badcount", b"\x01" + copy(1, 1, [(0, 1)], count=2) + copy(1, 1, [], count=300, req=2)
    # EDIT (op 15): MOVE/PUT/GET in order over written pages, a new page, then bad entries and lengths.
    def edit(ents, put=b"", count=None, req=1, space=1):
        body = ref(space) + b"".join(struct.pack("<HHIQQ", k, 0, n, a, b) for k, n, a, b in ents) + put
        return frame(15, body, count=len(ents) if count is None else count, req=req)
    yield "edit", b"\x01" + frame(8, ref(1) + ents + p0 + p1, count=2) + \
        edit([(1, 100, 50, 4096 * 5 + 8), (2, 8, 0, 4096 * 7), (3, 16, 4096 * 7, 0), (1, 4086, 10, 0)],
             put=bytes(range(8)), req=2) + frame(7, ref(1) + struct.pack("<2Q", 5, 7), count=2, req=3)
    yield "edit_bad", b"\x01" + edit([(9, 8, 0, 8)]) + edit([(1, 0, 0, 8)], req=2) + \
        edit([(1, 16, 4090, 0)], req=3) + edit([(3, 8, 1 << 40, 0)], req=4) + edit([(2, 8, 0, 0)], put=b"abc", req=5) + \
        edit([(3, 8, 4096 * 3, 0)], req=6) + edit([], count=600, req=7) + edit([(1, 8, 0, 8)], space=9, req=8)


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, data in seeds():
        (OUT / name).write_bytes(data)
    print(f"{len(list(seeds()))} seeds in {OUT}")
