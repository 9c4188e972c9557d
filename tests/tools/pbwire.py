"""Protobuf wire format and llamad framing for the tests' fake daemons
(tests/integration/nvim/fake_server.py, tests/integration/llamactl_json.sh,
tests/tools/fake_llamad.py):
enough to write a Response by field numbers and to read a Request's frame,
without generated code. Frames are a 4-byte big-endian length, then the body.
"""
import struct


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(b, i):
    """The varint at b[i:]: (value, index after it)."""
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def field(num, wire, payload):
    """Field NUM: wire 0 with an int payload, wire 2 with bytes."""
    tag = varint(num << 3 | wire)
    if wire == 0:
        return tag + varint(payload)
    return tag + varint(len(payload)) + payload


def frame(body):
    return struct.pack(">I", len(body)) + body


def _read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(conn):
    """The next frame's body, or None once the peer has closed."""
    head = _read_exact(conn, 4)
    if head is None:
        return None
    return _read_exact(conn, struct.unpack(">I", head)[0])


def fields(b):
    """A message's fields by number: {number: [values]}, each value an int
    (varint) or bytes (length-delimited, or the raw 8 or 4 bytes of a
    fixed-size field)."""
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = read_varint(b, i)
        elif wire == 2:
            n, i = read_varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            size = 8 if wire == 1 else 4
            v, i = b[i:i + size], i + size
        out.setdefault(num, []).append(v)
    return out
