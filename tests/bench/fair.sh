#!/bin/sh
# tests/bench/fair.sh — one user's many generations against another's one
# (make bench; daemon/fair.h). One daemon on stories260K per run; uid
# 65534 keeps $HOG generations of 256 tokens running while root times
# $N greedy 32-token generations (tests/bench/fair.py: wall time over the
# socket and the daemon's own), against the same on the idle daemon;
# fair_share on and off alternated, $ROUNDS times each. Prints one
# bench=fair line per run and a summary: the median ratio busy / idle of
# each (target, fair_share on: at most 3). Skipped when not root (the
# hog must be another user).
# Env: BUILD, MODELS, HOG (64), N (11), ROUNDS (3), THREADS (0: all).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
HOG=${HOG:-64}
N=${N:-11}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-0}
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
    echo "fair bench: skipped (needs root and setpriv: the hog is another user)"
    exit 0
fi
dir=$(mktemp -d /tmp/llamad-fair.XXXXXX) && chmod 755 "$dir"
sock=$dir/sock
pid=; hog=
trap '[ -n "$hog" ] && kill "$hog" 2>/dev/null; [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/bench" "$dir/tools" && cp tests/bench/fair.py "$dir/bench/" &&
    cp tests/tools/pbwire.py "$dir/tools/" && chmod -R a+rX "$dir"

run() {  # on|off: prints "idle_wall idle_own busy_wall busy_own"
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --state-dir none --socket "$sock" --socket-mode 0666 --threads "$THREADS" \
        --fair-share "$1" --log-level warning 2>"$dir/log" &
    pid=$!
    i=0
    until [ -S "$sock" ]; do
        i=$((i + 1)); [ $i -le 100 ] || { echo "fair bench: the daemon did not start" >&2; exit 1; }
        sleep 0.1
    done
    python3 "$dir/bench/fair.py" victim "$sock" 3 >/dev/null        # warm up
    idle=$(python3 "$dir/bench/fair.py" victim "$sock" "$N")
    setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$dir/bench/fair.py" hog "$sock" \
        "$HOG" 60 2>/dev/null &
    hog=$!
    sleep 2
    busy=$(python3 "$dir/bench/fair.py" victim "$sock" "$N")
    kill "$hog"; wait "$hog" 2>/dev/null; hog=
    kill "$pid"; wait "$pid" 2>/dev/null; pid=
    rm -f "$sock"
    echo "$idle $busy"
}
on=; off=
r=0
while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    for mode in on off; do
        set -- $(run $mode)
        echo "bench=fair fair_share=$mode round=$r idle_ms=$1 idle_daemon_ms=$2 busy_ms=$3 busy_daemon_ms=$4" \
            "ratio=$(echo "$3 $1" | awk '{ printf "%.1f", $1 / $2 }')" \
            "daemon_ratio=$(echo "$4 $2" | awk '{ printf "%.1f", $1 / $2 }')"
        ratio=$(echo "$3 $1" | awk '{ printf "%.2f", $1 / $2 }')
        if [ $mode = on ]; then on="$on $ratio"; else off="$off $ratio"; fi
    done
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
m_on=$(median $on); m_off=$(median $off)
echo "bench=fair_summary hog=$HOG ratio_on=$m_on ratio_off=$m_off target=3 $(echo "$m_on" | awk '{ print ($1 <= 3) ? "met" : "missed" }')"
