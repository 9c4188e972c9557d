#!/bin/sh
# Run the tests: cmocka unit binaries (build/tests/test_*), then the shell
# tests (tests/golden/*.sh, tests/integration/*.sh, tests/load/run.sh), then
# the man page lint.
# Ends with one line "N passed, N failed" (cmocka cases + shell tests).
# Env: BUILD (build folder), MODELS (../shared/models), SHARED; FUZZ_BUILD
# (set: also run the libFuzzer targets built there, FUZZ_TIME s each, one
# test per target; see tests/fuzz/run.sh).
# Selection: LAYERS, the layers to run (default "unit shell": unit = the
# cmocka binaries, shell = the shell tests and the man lint); T, one test
# by name (a unit binary: test_store; a shell test: device, llamactl_golden,
# load for tests/load/run.sh, mandoc-lint), run alone (no fuzzing). A T that
# names no test is an error (exit 2).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
LAYERS=${LAYERS:-unit shell}
export BUILD MODELS SHARED
pass=0; fail=0; failed=""; ran=0
log=$(mktemp); trap 'rm -f "$log"' EXIT

# want LAYER NAME: 0 if the test NAME of LAYER is selected
want() {
    if [ -n "$T" ]; then [ "$2" = "$T" ]; else case " $LAYERS " in *" $1 "*) ;; *) false ;; esac; fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    want unit "$name" || continue
    ran=$((ran + 1))
    echo "== $name"
    "$t" >"$log" 2>&1; rc=$?
    cat "$log"
    # summed over the binary's groups (test_chat, test_turns run two)
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{ n += $1 } END { print n + 0 }')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{ n += $1 } END { print n + 0 }')
    p=${p:-0}; f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed
    pass=$((pass + p)); fail=$((fail + f))
    [ "$f" -ne 0 ] && failed="$failed $name"
done

for s in tests/golden/*.sh tests/integration/*.sh tests/load/run.sh; do
    [ -f "$s" ] || continue
    name=$(basename "$s" .sh)
    [ "$s" = tests/load/run.sh ] && name=load
    want shell "$name" || continue
    ran=$((ran + 1))
    echo "== $name"
    if sh "$s" >"$log" 2>&1; then
        pass=$((pass + 1)); cat "$log"; echo "ok: $name"
    else
        fail=$((fail + 1)); cat "$log"; echo "FAILED: $name"; failed="$failed $name"
    fi
done

if ls man/*.[0-9] >/dev/null 2>&1 && want shell mandoc-lint; then
    ran=$((ran + 1))
    echo "== mandoc -Tlint"
    if mandoc -Tlint -W warning man/*.[0-9]; then pass=$((pass + 1)); else
        fail=$((fail + 1)); failed="$failed mandoc-lint"; fi
fi

if [ -n "$FUZZ_BUILD" ] && [ -z "$T" ]; then
    sh tests/fuzz/run.sh >"$log" 2>&1
    cat "$log"
    p=$(grep -c '^ok: fuzz_' "$log"); f=$(grep -c '^FAILED: fuzz_' "$log")
    pass=$((pass + p)); fail=$((fail + f))
    [ "$f" -ne 0 ] && failed="$failed $(sed -n 's/^FAILED: \(fuzz_[a-z0-9_]*\).*/\1/p' "$log" | tr '\n' ' ')"
fi

if [ -n "$T" ] && [ "$ran" -eq 0 ]; then
    echo "tests/run.sh: no test named $T (a unit binary in $BUILD/tests, or a shell test)" >&2
    exit 2
fi
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
