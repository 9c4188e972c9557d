#!/usr/bin/env python3
"""tests/bench/fair.py — the two sides of tests/bench/fair.sh, over the
protocol (tests/tools/pbwire.py), without llamactl's process start:

  fair.py hog SOCKET N SECONDS    N generations of 256 raw tokens kept
                                  running, each in a session of its own
                                  (dropped and made anew as one ends)
  fair.py victim SOCKET N         N greedy 32-token generations of "Once
                                  upon a time", one after another, each in
                                  an ephemeral session: prints the median
                                  wall milliseconds (Generate sent to Done
                                  read) and the median of the daemon's own
                                  (Done.prefill_ms + generate_ms)
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from pbwire import field, fields, frame, read_frame  # noqa: E402

GREEDY = b"\x0d" + struct.pack("<f", 0.0)   # SamplerOptions.temperature = 0


def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s


def send(s, rid, op, payload):
    s.sendall(frame(field(1, 0, rid) + field(op, 2, payload)))


def victim(path, n):
    s = connect(path)
    send(s, 1, 2, field(1, 0, 1))
    read_frame(s)
    wall, own, rid = [], [], 1
    for i in range(n):
        name = b"fair-victim-%d" % i
        rid += 1
        send(s, rid, 3, field(1, 2, name) + field(3, 0, 2) + field(6, 0, 1))   # raw, ephemeral
        read_frame(s)
        rid += 1
        t0 = time.perf_counter()
        send(s, rid, 5, field(1, 2, name) + field(2, 2, b"Once upon a time") + field(3, 0, 3) +
             field(4, 0, 32) + field(5, 2, GREEDY))
        while True:
            r = fields(read_frame(s))
            if 7 in r or 2 in r:
                break
        wall.append((time.perf_counter() - t0) * 1e3)
        if 7 in r:
            d = fields(r[7][0])
            own.append(sum(struct.unpack("<d", d[k][0])[0] for k in (4, 5) if k in d))
        rid += 1
        send(s, rid, 7, field(1, 2, name))
        read_frame(s)
    wall.sort()
    own.sort()
    print("%.2f %.2f" % (wall[len(wall) // 2], own[len(own) // 2] if own else 0))


def hog(path, n, seconds):
    s = connect(path)
    s.setblocking(True)
    rid, gen_of, rounds = 0, {}, [0] * n

    def start(k):
        nonlocal rid
        name = b"fair-hog-%d-%d" % (k, rounds[k])
        if rounds[k]:
            rid += 1
            send(s, rid, 7, field(1, 2, b"fair-hog-%d-%d" % (k, rounds[k] - 1)))
        rid += 1
        send(s, rid, 3, field(1, 2, name) + field(3, 0, 2))
        rid += 1
        send(s, rid, 5, field(1, 2, name) + field(2, 2, b"Once upon a time") + field(3, 0, 3) +
             field(4, 0, 256))
        gen_of[rid] = k
        rounds[k] += 1

    for k in range(n):
        start(k)
    end = time.time() + seconds
    while time.time() < end:
        r = fields(read_frame(s) or b"")
        i = r.get(1, [0])[0]
        if i in gen_of and (7 in r or 2 in r):
            start(gen_of.pop(i))


if __name__ == "__main__":
    if sys.argv[1] == "victim":
        victim(sys.argv[2], int(sys.argv[3]))
    else:
        hog(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
