"""tests/tools/two_frames.py SOCKET: two connections of one uid each send a
12 MiB Tokenize frame (over max_text: the answer is TOO_LARGE, but the
frame must be read whole), in alternating 64 KiB pieces; both must be
answered (tests/integration/partial_frames.sh). Two frames that together
pass the uid's budget of unfinished frames must not wait for each other.
"""
import socket, struct, sys, time
sys.path.insert(0, "tests/tools")
from pbwire import field, fields, frame, read_frame
text = b"x" * (12 << 20)
body = field(1, 0, 5) + field(11, 2, field(1, 2, text))
data = struct.pack(">I", len(body)) + body
ss = [socket.socket(socket.AF_UNIX) for _ in range(2)]
for s in ss:
    s.connect(sys.argv[1])
    s.setblocking(False)
off = [0, 0]
t = time.time()
while min(off) < len(data) and time.time() - t < 40:
    moved = 0
    for k, s in enumerate(ss):
        if off[k] < len(data):
            try:
                n = s.send(data[off[k]:off[k] + 65536])
                off[k] += n
                moved += n
            except BlockingIOError:
                pass
    if not moved:
        time.sleep(0.01)
assert min(off) == len(data), ("stuck", off, len(data))
for s in ss:
    s.setblocking(True)
    s.settimeout(20)
    r = fields(read_frame(s))
    assert 2 in r, r.keys()   # an Error (TOO_LARGE): the frame was read whole
print("both answered in %.1f s" % (time.time() - t))
