#!/usr/bin/env python3
"""tests/tools/chatpty.py — drive `llamactl chat` on a terminal (a pty).

usage: chatpty.py LLAMACTL SOCKET KEYS [chat options...]

Runs LLAMACTL --socket SOCKET chat OPTIONS with stdin, stderr (and stdout,
unless $OUT names a file to write it to instead) on a pty; once the prompt
shows, types each line of the file KEYS and Enter, waiting for the next
prompt after each (\\e, \\r and \\n in KEYS stand for ESC, CR and LF; a line
"@restart" runs $RESTART, a shell script, instead of typing); then Ctrl-D.
Prints what the terminal showed, then "[exit N]". Every wait is bounded.
"""
import os, pty, select, subprocess, sys, time

ctl, sock, keys = sys.argv[1:4]
master, slave = pty.openpty()
out_path = os.environ.get("OUT")
stdout = open(out_path, "wb") if out_path else slave
p = subprocess.Popen([ctl, "--socket", sock, "chat"] + sys.argv[4:], stdin=slave, stdout=stdout,
                     stderr=slave, close_fds=True)
os.close(slave)
out = b""


def until(pred, secs=30):
    global out
    end = time.time() + secs
    while not pred(out) and time.time() < end:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                out += os.read(master, 65536)
            except OSError:
                break


def prompt_after(n):
    return lambda o: o.count(b"> ") > n and o.rstrip().endswith(b">")


until(prompt_after(0))
for line in open(keys, "rb"):
    line = line.rstrip(b"\n").replace(b"\\e", b"\x1b").replace(b"\\r", b"\r").replace(b"\\n", b"\n")
    if line == b"@restart":
        subprocess.run(["sh", os.environ["RESTART"]], check=True)
        continue
    if p.poll() is not None:
        break
    n = out.count(b"> ")
    os.write(master, line + b"\r")
    until(lambda o, n=n: prompt_after(n)(o) or p.poll() is not None)
if p.poll() is None:
    os.write(master, b"\x04")
until(lambda o: p.poll() is not None, 15)
if p.poll() is None:   # say what the terminal showed, then give up on it
    p.kill()
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.write("\n[exit %s]\n" % (p.wait(5) if p.returncode is None else p.returncode))
