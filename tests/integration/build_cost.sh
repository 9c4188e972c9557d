#!/bin/sh
# tests/integration/build_cost.sh — what make does before it builds, from
# make -n (nothing is compiled here; a few seconds):
#  - make demo installs only the build's Debian packages (no editors,
#    clang, debhelper, lintian, mandoc, numpy); make test installs those
#    too; make deb the build's and the package tools;
#  - the unit tests' objects are kept (make -n in an empty build folder
#    deletes nothing), and in $BUILD, built by make test, make -q all
#    finds nothing to do: make demo after make test (or the reverse)
#    compiles nothing;
#  - the first nvcc command is preceded, once, by the line that says what
#    the CUDA backend costs (the same figure as README.md's), none with
#    CUDA=0; make deb says it builds its own copy and what that costs;
#  - nvcc runs one device front end per file (sm_90a code and compute_90
#    PTX from one compute_90 pass): nvcc --dryrun of the Makefile's own
#    command, when nvcc is here; else the -gencode options alone.
# A fake nvcc (NVCC=/bin/true) stands in where none is installed. Env:
# BUILD (its build must be done for the make -q part: skipped otherwise,
# and for build-tsan, which builds a few programs only).
BUILD=${BUILD:-build}
. tests/tools/daemon.sh
test_frame
empty=$dir/empty
# make as the test targets call it (their variables come in MAKEFLAGS)
mk() { make --no-print-directory "$@" 2>&1; }
# the packages of a make -n's deps.sh line
pkgs() { sed -n 's|^sh tests/tools/deps.sh ||p' | head -1; }
has() { case " $1 " in *" $2 "*) true ;; *) false ;; esac; }

# ---- Debian packages --------------------------------------------------------------
test_only="neovim emacs-nox debhelper lintian mandoc clang libclang-rt-14-dev python3-numpy"
demo=$(mk -n demo BUILD="$empty" | pkgs)
test=$(mk -n test T=none BUILD="$empty" | pkgs)
deb=$(mk -n deb BUILD="$empty" | pkgs)
if [ -z "$demo" ] || [ -z "$test" ] || [ -z "$deb" ]; then
    bad "no deps.sh line in make -n demo / test / deb"
else
    extra=
    for p in $test_only; do has "$demo" "$p" && extra="$extra $p"; done
    [ -z "$extra" ] && ok "make demo installs none of the tests' packages" ||
        bad "make demo installs what only the tests use:$extra"
    missing=
    for p in gcc libcmocka-dev libevent-dev protobuf-c-compiler; do has "$demo" "$p" || missing="$missing $p"; done
    [ -z "$missing" ] && ok "make demo installs the build's ($(echo "$demo" | wc -w) packages)" ||
        bad "make demo does not install:$missing"
    missing=
    for p in $demo $test_only; do has "$test" "$p" || missing="$missing $p"; done
    [ -z "$missing" ] && ok "make test installs those and the tests' ($(echo "$test" | wc -w) packages)" ||
        bad "make test does not install:$missing"
    has "$deb" debhelper && has "$deb" dpkg-dev && ! has "$deb" neovim && ! has "$deb" lintian &&
        ok "make deb installs the build's and the package tools only" || bad "make deb installs: $deb"
fi

# ---- intermediates, and one build for demo and test ------------------------------
mk -n all BUILD="$empty" CUDA=0 > "$dir/all.n"
if grep -q "^rm .*tests/unit/test_.*\.o" "$dir/all.n"; then
    bad "make deletes the unit tests' objects after linking them (the next make compiles them again):"
    grep "^rm .*tests/unit/" "$dir/all.n" | cut -c1-200
else
    grep -q "tests/unit/test_.*\.o" "$dir/all.n" && ok "the unit tests' objects are kept" ||
        bad "make -n all shows no unit-test object"
fi
case $BUILD in
*tsan*) echo "skipped: make -q all in $BUILD (the tsan build makes a few programs only)" ;;
*)
    if [ ! -x "$BUILD/llamad" ] || [ ! -x "$BUILD/tests/test_store" ]; then
        echo "skipped: make -q all ($BUILD is not built)"
    else
        # a build made with CUDA=0 where nvcc is found
        cuda=
        [ -f "$BUILD/kernels/cuda/matmul.o" ] || cuda=CUDA=0
        if mk -q all BUILD="$BUILD" $cuda >/dev/null; then
            ok "make -q all: nothing to rebuild in $BUILD (make demo after make test compiles nothing)"
        else
            bad "make -q all in $BUILD: something to rebuild after make test built it:"
            mk -n all BUILD="$BUILD" $cuda | grep -- ' -c ' | head -5 | cut -c1-200
        fi
        mk -n demo BUILD="$BUILD" $cuda > "$dir/demo.n"
        if grep -q -- ' -c \| -o ' "$dir/demo.n"; then
            bad "make demo after make test compiles or links again:"; grep -- ' -c \| -o ' "$dir/demo.n" | head -3
        else
            grep -q "BUILD=$BUILD sh tests/tools/demo.sh" "$dir/demo.n" &&
                ok "make demo runs demo.sh on $BUILD, building nothing" || bad "make -n demo: $(tail -1 "$dir/demo.n")"
        fi
    fi
    ;;
esac

# ---- what the CUDA backend costs --------------------------------------------------
NVCC_REAL=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
mk -n all BUILD="$empty" NVCC=/bin/true > "$dir/cuda.n"
n=$(grep -c "building the CUDA backend" "$dir/cuda.n")
say=$(grep -n "building the CUDA backend" "$dir/cuda.n" | head -1)
first=$(grep -n '^/bin/true ' "$dir/cuda.n" | head -1 | cut -d: -f1)
if [ "$n" -eq 1 ] && [ -n "$first" ] && [ "${say%%:*}" -lt "$first" ]; then
    line=$(echo "${say#*:}" | sed 's/^echo "//; s/"$//')
    ok "one line before the first nvcc: $line"
    cost=$(echo "$line" | sed -n 's/.*(\(about [0-9]* min of CPU\).*/\1/p')
    echo "$line" | grep -q "CUDA=0" || bad "the line does not say CUDA=0 skips it"
    if [ -z "$cost" ]; then
        bad "the line gives no 'about N min of CPU'"
    elif tr '\n' ' ' < README.md | tr -s ' ' | grep -q "$cost"; then
        ok "README.md gives the same cost ($cost)"
    else
        bad "README.md does not say '$cost'"
    fi
else
    bad "with nvcc, $n line(s) about the CUDA backend's cost (want one, before the first nvcc at line $first)"
fi
mk -n all BUILD="$empty" CUDA=0 | grep -q "CUDA backend" && bad "a CUDA line with CUDA=0" ||
    ok "no CUDA line with CUDA=0"
d=$(mk -n deb BUILD="$empty" NVCC=/bin/true | grep "^echo \"make deb:")
case $d in
*"its own copy"*"with the CUDA backend"*"about "*" min of CPU"*"CUDA=0"*) ok "make deb says: ${d#echo }" ;;
*) bad "make deb (with nvcc) says: '$d'" ;;
esac
d=$(mk -n deb BUILD="$empty" CUDA=0 | grep "^echo \"make deb:")
case $d in
*"its own copy"*"without the CUDA backend"*"about "*" min of CPU"*) ok "make deb CUDA=0 says: ${d#echo }" ;;
*) bad "make deb CUDA=0 says: '$d'" ;;
esac

# ---- one device front end per .cu -------------------------------------------------
cmd=$(grep '^/bin/true .* -c kernels/cuda/add\.cu' "$dir/cuda.n" | head -1 | sed 's|^/bin/true ||')
if [ -z "$cmd" ]; then
    bad "no nvcc command for kernels/cuda/add.cu in make -n"
elif [ -n "$NVCC_REAL" ]; then
    # the Makefile's command line, split as make's shell does; --dryrun
    # only prints the steps
    eval "\"$NVCC_REAL\" --dryrun $cmd" > "$dir/dry" 2>&1 ||
        { bad "nvcc --dryrun failed:"; tail -5 "$dir/dry"; }
    fe=$(grep -c 'cicc"* ' "$dir/dry")
    pt=$(grep -c 'ptxas"* ' "$dir/dry")
    if [ "$fe" -eq 1 ] && [ "$pt" -eq 1 ] && grep -q 'kind=elf,sm=90a' "$dir/dry" &&
        grep -q 'kind=ptx,sm=90,' "$dir/dry"; then
        ok "nvcc: one front end (cicc) and one ptxas per file, for sm_90a code and compute_90 PTX"
    else
        bad "nvcc runs $fe front end(s) (cicc) and $pt ptxas per file (want 1 and 1, sm_90a + compute_90 PTX):"
        grep -o 'cicc.*-arch [a-z_0-9]*\|ptxas.*-arch=[a-z_0-9]*\|--image3=[^ ]*' "$dir/dry" | sed 's/ .* -arch/ ... -arch/'
    fi
else
    arches=$(echo "$cmd" | grep -o 'arch=compute_[0-9a-z]*' | sort -u | wc -l)
    case $cmd in
    *sm_90a*compute_90*) [ "$arches" -eq 1 ] && ok "one virtual architecture in -gencode (no nvcc here)" ||
                             bad "$arches virtual architectures in -gencode: $cmd" ;;
    *) bad "no sm_90a code or compute_90 PTX: $cmd" ;;
    esac
fi

[ "$fail" -eq 0 ] && echo "build_cost: all ok"
exit "$fail"
