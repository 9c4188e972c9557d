#!/bin/sh
# The daemon's threads (event loop, engine, CPU workers) under
# ThreadSanitizer: the daemon tests, the llamactl integration tests and a
# short load run against a TSan build of llamad (BUILD, default build-tsan;
# made by `make test-tsan`). A race report makes the daemon exit 66
# (TSAN_OPTIONS exitcode) or shows in its log; both fail the test.
# Ends with "N passed, N failed". Env: BUILD, MODELS, SHARED.
BUILD=${BUILD:-build-tsan}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
export BUILD MODELS SHARED
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0 exitcode=66 second_deadlock_stack=1}"
pass=0; fail=0; failed=""
log=$(mktemp); trap 'rm -f "$log"' EXIT
run() {  # name command...
    name=$1; shift
    echo "== $name"
    if "$@" >"$log" 2>&1 && ! grep -q "WARNING: ThreadSanitizer" "$log"; then
        pass=$((pass + 1)); tail -n 3 "$log"; echo "ok: $name"
    else
        fail=$((fail + 1)); cat "$log"; echo "FAILED: $name"; failed="$failed $name"
    fi
}
run test_daemon "$BUILD/tests/test_daemon"
run test_persist "$BUILD/tests/test_persist"
run llamactl_golden sh tests/integration/llamactl_golden.sh
run backend_failure sh tests/integration/backend_failure.sh
run load env CONNS=16 SECS=4 SECS2=2 IDLE=200 HALF=4 IDLE_TIMEOUT=5 sh tests/load/run.sh
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
