"""A fake llamad for tests/integration/llamactl_json_golden.sh: canned
replies a real daemon does not give, so that llamactl's --json output is
also pinned where fields are unset, enum values unknown, text not UTF-8,
numbers need rounding, or a transcript comes in pages.

    python3 fake_llamad.py DIR

listens on three sockets in DIR, one connection at a time each:
  fake.sock   answers every request from the tables below (by op and by
              the session named in it);
  reply.sock  answers every request with Ok (an unexpected reply to Hello);
  close.sock  reads the first frame and closes the connection.
It writes DIR/fake.ready once listening and runs until killed.
"""
import os
import selectors
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pbwire import field, fields, frame, read_frame, varint  # noqa: E402


def u(num, v):
    """A varint field; negative numbers as 64-bit two's complement."""
    return field(num, 0, v & (2**64 - 1))


def s(num, v):
    """A length-delimited field: str (UTF-8) or bytes."""
    return field(num, 2, v.encode() if isinstance(v, str) else v)


def d(num, v):
    """A double field (wire type 1)."""
    return varint(num << 3 | 1) + struct.pack("<d", v)


def packed(num, vals):
    return s(num, b"".join(varint(v) for v in vals))


# Response body fields
ERROR, HELLO, SESSION, SESSIONS, TOKEN, DONE, TOKENS, STATUS, OK, SAVED, TRANSCRIPT = \
    2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13
# Request op fields
OP_HELLO, OP_OPEN, OP_GENERATE, OP_FORK, OP_DROP, OP_LIST, OP_INFO, OP_TOKENIZE, \
    OP_STATUS, OP_SAVE, OP_TRANSCRIPT = 2, 3, 5, 6, 7, 8, 9, 11, 14, 15, 16

# SessionInfo "odd": enum values llamactl does not know, a created flag
# that is set but false, a system prompt with control bytes; "empty": no
# field at all.
INFO = {
    b"odd": s(1, "odd") + u(2, 7) + u(7, -5) + u(8, 7) + u(9, 9) + s(14, "a\tb\x01c\x7f")
            + u(18, 0) + u(19, 3) + u(20, 9) + u(22, 1234),
    b"empty": b"",
    # after the answer: fewer turns than at the open (OPEN_TURNS) plus one
    b"shift-old": s(1, "shift-old") + u(10, 4),
    b"shift-new": s(1, "shift-new") + u(10, 4),
}
# The turns an OpenSession reply says the session has, by session.
OPEN_TURNS = {b"shift-old": 6, b"shift-new": 6}

# A Generate's replies, by session: TokenEvents then the terminal reply
GENERATE = {
    # an event without text or tokens; text that is not UTF-8, quotes,
    # escapes; Done with a stop reason, timings to round, no stop string
    b"g1": [(TOKEN, b""),
            (TOKEN, s(1, b"\xff\xfeok\xc3 \"q\" \\ \x1f\x7f \xe2\x98\x83") + packed(2, [5, 6])),
            (DONE, u(1, 1) + u(2, 3) + u(3, 2) + d(4, 2.71828) + d(5, 0.0004) + u(6, 9))],
    # Done with no field set
    b"g2": [(DONE, b"")],
    # cancelled, with the stop string set and a timing that rounds up
    b"g3": [(TOKEN, s(1, "x") + packed(2, [7])),
            (DONE, u(1, 5) + d(4, 1.0005) + d(5, 12345.6789) + s(7, "\n"))],
    # an unknown reason
    b"g4": [(DONE, u(1, 42))],
    # a context shift: an older daemon's Done (no dropped_* fields), and
    # this one's (2 turns and 30 tokens dropped, 10 of them the answer's)
    b"shift-old": [(TOKEN, s(1, "x") + packed(2, [7])), (DONE, u(1, 2) + u(3, 1))],
    b"shift-new": [(TOKEN, s(1, "x") + packed(2, [7])),
                   (DONE, u(1, 2) + u(3, 1) + u(8, 2) + u(9, 30) + u(10, 10))],
    # errors: a server error, and a code llamactl does not know without a message
    b"e1": [(ERROR, u(1, 101) + s(2, "boom"))],
    b"e2": [(ERROR, u(1, 42))],
}

# GetTranscript pages, by (session, from_turn)
TURN0 = u(1, 0) + u(2, 1) + s(3, "be brief") + u(4, 3) + u(5, 0)
TURN1 = u(1, 1) + u(2, 2) + u(4, 2) + u(5, 3) + u(6, 1) + u(7, 1) + packed(8, [5, 6]) + u(9, 1)
TURN2 = u(1, 2) + u(2, 9) + s(3, "x\ny") + u(4, 1) + u(5, 5) + u(6, 1) + u(7, 5)
TRANSCRIPT_PAGES = {
    (b"t", 0): s(1, "t") + u(2, 3) + u(3, 0) + u(4, 2) + s(5, TURN0) + s(5, TURN1)
               + u(8, 2) + u(9, 1),
    (b"t", 2): s(1, "t") + u(2, 3) + u(3, 2) + u(4, 3) + s(5, TURN2),
    (b"u", 0): b"",
}

STATUS_REPLY = s(1, "fake 1") + d(5, 12.3456789) + u(6, 2) + u(12, 2**40) + s(22, "")
TOKENS_REPLY = packed(1, [1, 2, 3]) + s(2, "a") + s(2, b"\xff")


def answer(op, m):
    """The replies (body field, body bytes) to request op with fields m."""
    name = m.get(1, [b""])[0]
    if op == OP_HELLO:
        return [(HELLO, u(1, 1) + s(2, "fake") + s(3, "no model") + u(4, 65536)
                 + u(5, 512))]
    if op == OP_OPEN:
        turns = OPEN_TURNS.get(name)
        return [(SESSION, s(1, name) + (u(10, turns) if turns else b"") + u(18, 1))]
    if op == OP_GENERATE:
        return GENERATE.get(name, [(DONE, b"")])
    if op == OP_INFO:
        if name in INFO:
            return [(SESSION, INFO[name])]
        return [(ERROR, u(1, 2) + s(2, "no session named '%s'" % name.decode()))]
    if op == OP_FORK:
        return [(SESSION, s(1, m[2][0]) + u(18, 1) + u(19, 0))]
    if op == OP_DROP:
        return [(OK, b"")]
    if op == OP_LIST:
        return [(SESSIONS, s(1, INFO[b"odd"]) + s(1, INFO[b"empty"]))]
    if op == OP_TOKENIZE:
        return [(TOKENS, TOKENS_REPLY)]
    if op == OP_STATUS:
        return [(STATUS, STATUS_REPLY)]
    if op == OP_SAVE:
        return [(SAVED, b"")]
    if op == OP_TRANSCRIPT:
        page = TRANSCRIPT_PAGES.get((name, m.get(2, [0])[0]))
        if page is not None:
            return [(TRANSCRIPT, page)]
    return [(ERROR, u(1, 9) + s(2, "the fake does not know that"))]


def serve(conn, mode):
    while True:
        body = read_frame(conn)
        if body is None or mode == "close":
            return
        req = fields(body)
        rid = req.get(1, [0])[0]
        ops = [n for n in req if n != 1]
        if mode == "reply":
            replies = [(OK, b"")]
        else:
            op = ops[0] if ops else 0
            replies = answer(op, fields(req[op][0]) if op else {})
        for num, payload in replies:
            conn.sendall(frame(u(1, rid) + s(num, payload)))


def main():
    where = sys.argv[1]
    sel = selectors.DefaultSelector()
    for mode in ("fake", "reply", "close"):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(os.path.join(where, mode + ".sock"))
        srv.listen(4)
        sel.register(srv, selectors.EVENT_READ, mode)
    open(os.path.join(where, "fake.ready"), "w").close()
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept()
            with conn:
                try:
                    serve(conn, key.data)
                except (BrokenPipeError, ConnectionResetError):
                    pass


main()
