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
"""
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from pbwire import field, frame, read_frame  # noqa: E402


HELLO_REPLY = frame(
    field(1, 0, 1)  # id 1 (the client's Hello)
    + field(3, 2, field(1, 0, 1) + field(2, 2, b"fake llamad") + field(3, 2, b"no model")
            + field(4, 0, 1 << 20) + field(5, 0, 512) + field(6, 0, 1000)))


def serve(conn, mode):
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
    for mode in ("huge", "garbage", "trunc", "silent", "late"):
        listen(os.path.join(d, mode + ".sock"), mode)
    open(os.path.join(d, "ready"), "w").close()
    threading.Event().wait()


if __name__ == "__main__":
    main()
