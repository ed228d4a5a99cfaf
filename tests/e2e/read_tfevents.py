#!/usr/bin/env python3
"""read_tfevents.py DIR [--tensorboard]: the scalars of the TensorBoard event files in DIR, as one JSON object
{"files": N, "file_versions": [...], "starts": [[file, step], ...], "scalars": {tag: [[step, value], ...]}} on stdout,
for tests/e2e/test_tensorboard.cpp.

Without --tensorboard, a reader of its own that needs nothing outside the standard library: it checks every
record's framing (the length, both masked CRC-32Cs, no trailing bytes) and decodes the Event protobuf field by field,
then applies TensorBoard's rule for version-2 files: a SessionLog START at step S drops the scalars seen so far at
steps >= S. It exits 1 with a sentence on the first thing that is wrong.

With --tensorboard, TensorBoard's own EventAccumulator reads the directory (it applies the same rule); exit 77 when
the tensorboard package cannot be imported.
"""
import json
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            fail(f"{path}: {len(data) - pos} trailing bytes at offset {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked(header):
            fail(f"{path}: the length CRC at offset {pos} is wrong")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or len(data) < pos + 16 + length:
            fail(f"{path}: the record at offset {pos} is cut short")
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if body_crc != masked(body):
            fail(f"{path}: the data CRC of the record at offset {pos} is wrong")
        yield body
        pos += 16 + length


def varint(buf, pos):
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    """(field number, wire type, value) of a protobuf message: ints, floats' raw bytes, or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            fail(f"unexpected wire type {wire} of field {number}")
        yield number, wire, value


def own_reader(directory):
    out = {"files": 0, "file_versions": [], "starts": [], "scalars": {}}
    names = sorted(n for n in os.listdir(directory) if "tfevents" in n)
    for name in names:
        out["files"] += 1
        for body in records(os.path.join(directory, name)):
            step, wall_time, summary, session_status = 0, None, None, None
            for number, wire, value in fields(body):
                if number == 1 and wire == 1:
                    (wall_time,) = struct.unpack("<d", value)
                elif number == 2 and wire == 0:
                    step = value
                elif number == 3 and wire == 2:
                    out["file_versions"].append(value.decode())
                elif number == 5 and wire == 2:
                    summary = value
                elif number == 7 and wire == 2:
                    session_status = dict((n, v) for n, _, v in fields(value)).get(1, 0)
            if wall_time is None:
                fail(f"{name}: an event without wall_time")
            if session_status == 1:  # START: TensorBoard drops what was logged at this step or later
                out["starts"].append([name, step])
                for tag in out["scalars"]:
                    out["scalars"][tag] = [p for p in out["scalars"][tag] if p[0] < step]
            if summary is not None:
                for number, _, value in fields(summary):
                    if number != 1:
                        continue
                    parts = {n: v for n, _, v in fields(value)}
                    (simple_value,) = struct.unpack("<f", parts[2])
                    out["scalars"].setdefault(parts[1].decode(), []).append([step, simple_value])
    return out


def tensorboard_reader(directory):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"tensorboard is not importable: {e}", file=sys.stderr)
        sys.exit(77)
    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    return {
        "files": len([n for n in os.listdir(directory) if "tfevents" in n]),
        "scalars": {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]},
    }


if __name__ == "__main__":
    directory = sys.argv[1]
    result = tensorboard_reader(directory) if "--tensorboard" in sys.argv[2:] else own_reader(directory)
    print(json.dumps(result))
