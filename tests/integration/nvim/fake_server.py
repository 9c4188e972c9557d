#!/usr/bin/env python3
"""A fake llamad for tests/integration/nvim.sh: Unix sockets that answer the
client's first frame (its Hello) with something a client must survive.

    fake_server.py DIR     listen on DIR/<mode>.sock for every mode below,
                           then create DIR/ready; serve until killed.

Modes (each connection: read one frame, then):
  huge     a frame header announcing 0xFFFFFFF0 bytes, nothing more; stay open
  garbage  a frame of 4 bytes that do not decode as a Response; stay open
  trunc    a header announcing 100 bytes, 10 of them, then close
  silent   nothing; stay open (the client's Hello timeout must end it)
  late     a good HelloReply (max_text 1000), then, on the next frame,
           a header announcing 0x7FFFFFFF bytes; stay open
Modes answering the Hello, then each ListSessions (anything else: an
Error):
  pages    a list of 3 pages, sessions "page1-a" (its system prompt cut:
           256 bytes, system_cut), "page1-b", "page2-a", "page3-a";
           cursors opaque (PAGE_CURSORS), each page given only for the
           exact cursor of the page before (else an Error)
  endless  every page holds one session, "endless-<n>" (n = 1, 2, ...),
           and a new cursor: the list never ends
  stuck    one session "stuck" and the cursor "again", whatever is asked
"""
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from pbwire import field, fields, frame, read_frame  # noqa: E402


HELLO_REPLY = frame(
    field(1, 0, 1)  # id 1 (the client's Hello)
    + field(3, 2, field(1, 0, 1) + field(2, 2, b"fake llamad") + field(3, 2, b"no model")
            + field(4, 0, 1 << 20) + field(5, 0, 512) + field(6, 0, 1000)))


# after -> (sessions, next) of mode "pages"; the cursors are no session names
PAGE_CURSORS = {
    None: ([b"page1-a", b"page1-b"], "\u00e9\x01 cursor/1".encode()),
    "\u00e9\x01 cursor/1".encode(): ([b"page2-a"], b"~2~"),
    b"~2~": ([b"page3-a"], None),
}


def session_list(names, nxt):
    body = b""
    for n in names:
        info = field(1, 2, n) + field(2, 0, 3)
        if n == b"page1-a":  # a system prompt cut for the list
            info += field(14, 2, b"s" * 256) + field(23, 0, 1)
        body += field(1, 2, info)
    if nxt is not None:
        body += field(2, 2, nxt)
    return body


def serve_list(conn, mode):
    n = 0
    while True:
        req = read_frame(conn)
        if req is None:
            return
        f = fields(req)
        rid = f.get(1, [0])[0]
        if 2 in f:  # Hello
            conn.sendall(frame(field(1, 0, rid) + HELLO_REPLY[6:]))
            continue
        if 8 not in f:
            conn.sendall(frame(field(1, 0, rid) + field(2, 2, field(1, 0, 9) + field(2, 2, b"not a list"))))
            continue
        after = fields(f[8][0]).get(1, [None])[0]
        n += 1
        if mode == "pages":
            if after not in PAGE_CURSORS:
                conn.sendall(frame(field(1, 0, rid) + field(2, 2, field(1, 0, 1)
                                                             + field(2, 2, b"unknown cursor " + after))))
                continue
            body = session_list(*PAGE_CURSORS[after])
        elif mode == "endless":
            body = session_list([b"endless-%04d" % n], b"cursor %d" % n)
        else:
            body = session_list([b"stuck"], b"again")
        conn.sendall(frame(field(1, 0, rid) + field(5, 2, body)))


def serve(conn, mode):
    if mode in ("pages", "endless", "stuck"):
        with conn:
            return serve_list(conn, mode)
    with conn:
        if read_frame(conn) is None:
            return
        if mode == "huge":
            conn.sendall(struct.pack(">I", 0xFFFFFFF0))
        elif mode == "garbage":
            conn.sendall(frame(b"\xff\xff\xff\xff"))
        elif mode == "trunc":
            conn.sendall(struct.pack(">I", 100) + b"\x08\x01" * 5)
            return
        elif mode == "late":
            conn.sendall(HELLO_REPLY)
            if read_frame(conn) is None:
                return
            conn.sendall(struct.pack(">I", 0x7FFFFFFF))
        # stay open until the client goes away
        while conn.recv(65536):
            pass


def listen(path, mode):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def loop():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=serve, args=(conn, mode), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


def main():
    d = sys.argv[1]
    for mode in ("huge", "garbage", "trunc", "silent", "late", "pages", "endless", "stuck"):
        listen(os.path.join(d, mode + ".sock"), mode)
    open(os.path.join(d, "ready"), "w").close()
    threading.Event().wait()


if __name__ == "__main__":
    main()
