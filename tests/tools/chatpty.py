#!/usr/bin/env python3
"""tests/tools/chatpty.py — drive `llamactl chat` on a terminal (a pty).

usage: chatpty.py LLAMACTL SOCKET KEYS [chat options...]

Runs LLAMACTL --socket SOCKET chat OPTIONS with stdin, stderr (and stdout,
unless $OUT names a file to write it to instead) on a pty; once the prompt
shows, types each line of the file KEYS and Enter, waiting for the next
prompt after each (\\e, \\r and \\n in KEYS stand for ESC, CR and LF; a line
"@restart" runs $RESTART, a shell script, instead of typing; "@sleep S"
waits S seconds; a line
"@intr TEXT" types TEXT and Enter, waits for 8 characters of the answer
after "assistant: ", then types Ctrl-C); then Ctrl-D.
Prints what the terminal showed, then "[exit N]". Every wait is bounded.
"""
import fcntl, os, pty, select, subprocess, sys, termios, time

ctl, sock, keys = sys.argv[1:4]
master, slave = pty.openpty()
out_path = os.environ.get("OUT")
stdout = open(out_path, "wb") if out_path else slave
def ctty():
    # a session of its own with the pty as its controlling terminal, as in
    # a real one: Ctrl-C typed there is SIGINT to llamactl
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


p = subprocess.Popen([ctl, "--socket", sock, "chat"] + sys.argv[4:], stdin=slave, stdout=stdout,
                     stderr=slave, close_fds=True, preexec_fn=ctty)
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
    if line.startswith(b"@sleep "):
        time.sleep(float(line[7:]))
        continue
    if p.poll() is not None:
        break
    n = out.count(b"> ")
    if line.startswith(b"@intr "):
        k = out.count(b"assistant:")
        os.write(master, line[6:] + b"\r")
        until(lambda o, k=k: o.count(b"assistant:") > k and
              len(o.rsplit(b"assistant:", 1)[1].split(b"\x1b[0m", 1)[-1]) >= 9)
        os.write(master, b"\x03")
        until(lambda o, n=n: prompt_after(n)(o) or p.poll() is not None)
        continue
    os.write(master, line + b"\r")
    until(lambda o, n=n: prompt_after(n)(o) or p.poll() is not None)
if p.poll() is None:
    os.write(master, b"\x04")
until(lambda o: p.poll() is not None, 15)
if p.poll() is None:   # say what the terminal showed, then give up on it
    p.kill()
sys.stdout.write(out.decode("utf-8", "replace"))
sys.stdout.write("\n[exit %s]\n" % (p.wait(5) if p.returncode is None else p.returncode))
