# llamad — one entry point: deps, build, test, bench, install, demo.
#
#   make            build everything (build/: the programs and the unit
#                   tests); demo, test and bench build the same in the same
#                   folder, so one after another compiles nothing again
#   make text       the text layer alone (tokenizers, templates): its libraries
#                   and tests, linked without the weight loaders
#   make deps       install the Debian packages the build, the tests and the
#                   package need (make deps-build: only the build's and the
#                   demo's, which is all `make demo` and `make bench` install;
#                   the test targets install all; DEB_PKGS_* below)
#   make test       deps + build + every test (the CI entry point); ends with
#                   the line "N passed, N failed"
#   make test T=NAME  deps + build + one test: a unit binary (test_store) or
#                   a shell test (device, llamactl_golden, load, mandoc-lint)
#   make test-unit  deps + build + only the cmocka unit binaries
#   make test-shell deps + build + only the shell tests and the man lint
#   make demo       deps-build + build + the main job on the small default model
#   make bench      deps-build + build + benchmarks (see docs/PERF.md)
#   make test-asan  unit + golden tests under AddressSanitizer + UBSan
#   make test-tsan  the daemon's threads under ThreadSanitizer (tests/tsan.sh)
#   make fuzz       libFuzzer targets (tests/fuzz/) built with clang into
#                   build-fuzz/, each run FUZZ_TIME seconds (default 60)
#   make install    PREFIX=/usr/local DESTDIR= (make uninstall: the same, removed)
#   make deb        deps-deb + the Debian package (debian/) into $(BUILD)/deb/,
#                   built from its own copy of the tree (the CUDA backend too)
#
# Knobs: CUDA=0 forces the CUDA backend off (it is built when nvcc is found,
# at about 5 min of CPU, said by a line when it starts: CUDA_COST below);
# ARCH= sets the target ISA (default x86-64-v3; AVX-512 kernels are chosen at
# run time); OPT= optimisation flags; BUILD= output folder.

PREFIX  ?= /usr/local
NVIM_PACK = $(DESTDIR)$(PREFIX)/share/nvim/site/pack/llamad/start/llamad
DESTDIR ?=
BUILD   ?= build
OPT     ?= -O3
ARCH    ?= -march=x86-64-v3 -mtune=native
SAN     ?=
SHARED  ?= $(abspath ../shared)
MODELS  ?= $(SHARED)/models

# Debian packages, installed when missing by tests/tools/deps.sh:
#   DEB_PKGS_BUILD  what `make` and `make demo` / `make bench` need: the
#                   compilers, the libraries, cmocka (the unit-test binaries
#                   are part of `make`); `make deps-build`, run by demo, bench
#   DEB_PKGS_DEB    what `make deb` adds: dpkg-buildpackage and debhelper;
#                   `make deps-deb` (with DEB_PKGS_BUILD), run by deb
#   DEB_PKGS_TEST   what only the tests add: mandoc (man lint), numpy (the
#                   Llama 3 reference), systemd's tools and setpriv, clang
#                   (fuzz, tsan), the editors, lintian
#   DEB_PKGS_NODE   node and npm (the gateway's client tests), when no node
#                   is on PATH
# `make deps` installs all of them; every test target runs it.
DEB_PKGS_BUILD := gcc g++ make pkg-config libevent-dev libprotobuf-c-dev protobuf-c-compiler \
                  libsentencepiece-dev libsystemd-dev libjansson-dev libcmocka-dev libpcre2-dev \
                  libedit-dev libxxhash-dev
DEB_PKGS_DEB   := debhelper dpkg-dev
DEB_PKGS_TEST  := mandoc python3 python3-numpy systemd util-linux clang libclang-rt-14-dev \
                  neovim emacs-nox lintian
DEB_PKGS       := $(DEB_PKGS_BUILD) $(DEB_PKGS_DEB) $(DEB_PKGS_TEST)
# Node.js and npm: the HTTP gateway's tests drive it with pinned npm clients
# (tests/http/). `make deps` installs Debian's only when no node is on PATH:
# a node installed otherwise (with its own npm) is kept as it is.
DEB_PKGS_NODE  := nodejs npm

# CUDA hook: the CUDA backend (kernels/cuda/*.cu, and the layer candidates
# that wait for a GPU in kernels/cuda/candidates/) is compiled when nvcc is
# found, unless CUDA=0.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(CUDA),0)
  NVCC :=
endif
CUDA_SRCS := $(wildcard kernels/cuda/*.cu kernels/cuda/candidates/*.cu)
ifneq ($(NVCC),)
  ifneq ($(CUDA_SRCS),)
    HAVE_CUDA := 1
  endif
endif
# Hopper machine code (sm_90a) plus PTX that newer GPUs compile at start.
# cudart is linked statically; cuBLAS is opened at run time (dlopen), so the
# binaries start where the CUDA libraries are missing and use the CPU.
# Both come from one compute_90 front end (cicc): the kernels use nothing
# of sm_90a's own (wgmma, setmaxnreg), so a second, compute_90a front end
# gave the same machine code for 30 % more compile time (docs/PERF.md,
# "Build cost"; tests/gpu/same_code.py compared every kernel).
CUDA_HOME   ?= $(abspath $(dir $(NVCC))..)
CUDA_GENCODE ?= -gencode=arch=compute_90,code=[sm_90a,compute_90]
NVCCFLAGS   ?= -O3 -std=c++17 -lineinfo $(CUDA_GENCODE) -Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Werror,-fPIC
# What compiling it costs (docs/PERF.md, "Build cost"), said by the first
# nvcc command a make runs: nvcc's CPU time over kernels/cuda/*.cu on the
# 2-core AMD EPYC machine kind, 84 % of it candidates/fused.cu and
# matmul.cu (their matrix-vector kernels: one per batch size, dtype, mode
# and staging)
CUDA_COST  := about 5 min of CPU
CUDA_SAID  :=
cuda_say = $(if $(CUDA_SAID),,$(eval CUDA_SAID := 1)@echo "building the CUDA backend with nvcc \
	($(CUDA_COST); CUDA=0 skips it)")

# pkg-config is evaluated lazily: `make deps` may be what installs it.
PKG_LIBS = jansson libpcre2-8 sentencepiece libxxhash libprotobuf-c libevent libsystemd libedit
PKG_CFLAGS = $(shell pkg-config --cflags $(PKG_LIBS) 2>/dev/null)
CORE_PKG_LDLIBS = $(shell pkg-config --libs jansson libpcre2-8 sentencepiece libxxhash libprotobuf-c 2>/dev/null)
PROTO_LDLIBS = $(shell pkg-config --libs libprotobuf-c 2>/dev/null)
DAEMON_LDLIBS = $(shell pkg-config --libs libevent libsystemd 2>/dev/null)
CLIENT_LDLIBS = $(shell pkg-config --libs libedit 2>/dev/null)

WARN     := -Wall -Wextra -Werror
CPPFLAGS += -I. -I$(BUILD) -I$(BUILD)/proto -D_GNU_SOURCE
CFLAGS   ?=
CFLAGS   += -std=c11 $(OPT) $(ARCH) -g $(WARN) -pthread $(SAN) -MMD -MP
CXXFLAGS += -std=c++17 $(OPT) $(ARCH) -g $(WARN) -pthread $(SAN) -MMD -MP
LDFLAGS  += -pthread $(SAN)
LDLIBS   += -lm

# The libraries, leaf first. A program links those it uses in the reverse
# order: core, text, format, proto, util (MODEL_LIBS: all of them).
#   util    util/: causes, clocks, whole-file reads, UTF-8, element types
#           (libc only)
#   proto   proto/: the wire contract, framing, socket path, enum names
#   format  format/: GGUF, safetensors and llama2.c readers
#   text    text/: tokenizers, detokenizer, chat templates, stop strings
#   core    kernels/, model/ (weights, forward pass), generate/, session/
# text/ links without core: `make text` builds it and the programs that use
# only it (the tokenizer and template tests; fuzz_tokenizer, fuzz_bpe and
# fuzz_template link the same libraries in the fuzz build).
UTIL_LIB   := $(BUILD)/libllamad-util.a
UTIL_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard util/*.c))
FORMAT_LIB := $(BUILD)/libllamad-format.a
FORMAT_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard format/*.c))
TEXT_LIB   := $(BUILD)/libllamad-text.a
TEXT_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard text/*.c)) \
              $(patsubst %.cc,$(BUILD)/%.o,$(wildcard text/*.cc)) \
              $(BUILD)/proto/sentencepiece_model.pb-c.o
TEXT_LDLIBS = $(CORE_PKG_LDLIBS) -lstdc++ -lm

CORE_C   := $(wildcard kernels/*.c kernels/cpu/*.c kernels/cuda/*.c kernels/cuda/candidates/*.c \
                      model/*.c generate/*.c session/*.c)
CORE_OBJ := $(CORE_C:%.c=$(BUILD)/%.o)
CORE_LIB := $(BUILD)/libllamad-core.a
CORE_LDLIBS = $(TEXT_LDLIBS)
ifeq ($(HAVE_CUDA),1)
  CPPFLAGS    += -DLLAMAD_CUDA
  CORE_OBJ    += $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
  CORE_LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
endif

# proto/: the wire contract, compiled by protoc-c into $(BUILD)/proto
PROTO_GEN := $(BUILD)/proto/llamad.pb-c.c $(BUILD)/proto/llamad.pb-c.h
PROTO_OBJ := $(BUILD)/proto/llamad.pb-c.o $(BUILD)/proto/frame.o $(BUILD)/proto/names.o \
             $(BUILD)/proto/path.o
PROTO_LIB := $(BUILD)/libllamad-proto.a
# SentencePiece's ModelProto (the subset text/tok_parts.c writes): part of the
# text library, which therefore links libprotobuf-c
SPM_GEN   := $(BUILD)/proto/sentencepiece_model.pb-c.c $(BUILD)/proto/sentencepiece_model.pb-c.h

TEXT_LIBS  := $(TEXT_LIB) $(FORMAT_LIB) $(PROTO_LIB) $(UTIL_LIB)
MODEL_LIBS := $(CORE_LIB) $(TEXT_LIBS)

DAEMON_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard daemon/*.c))
CLIENT_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard client/*.c))
# gateway/: llamad-http, the OpenAI/Ollama HTTP gateway (a client of the socket)
GW_OBJ     := $(patsubst %.c,$(BUILD)/%.o,$(wildcard gateway/*.c))
# its pure parts (request parsing, answers, conversation matching), also
# linked into test_gateway and fuzz_http
GW_PURE_OBJ := $(BUILD)/gateway/api.o $(BUILD)/gateway/conv.o $(BUILD)/gateway/render.o
GW_LDLIBS   = $(shell pkg-config --libs libevent jansson libxxhash libsystemd libprotobuf-c 2>/dev/null)
TEST_SRCS  := $(wildcard tests/unit/test_*.c)
TEST_BINS  := $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
# the unit tests of text/ alone, linked without the core library
TEXT_TESTS := $(patsubst %,$(BUILD)/tests/%,test_tokenizer test_bpe test_chat test_stop)
TOOL_BINS  := $(BUILD)/llamad-genmodel $(BUILD)/llamad-bench $(BUILD)/llamad-kvq \
              $(BUILD)/llamad-bench-daemon $(BUILD)/llamad-gpucheck $(BUILD)/llamad-load

# the installed programs (llamactl below, when client/ is there), then the
# tools of the tests and benchmarks
BINS := $(BUILD)/llamad $(BUILD)/llamad-quantize $(TOOL_BINS)
ifneq ($(CLIENT_OBJ),)
  BINS += $(BUILD)/llamactl
endif
ifneq ($(GW_OBJ),)
  BINS += $(BUILD)/llamad-http
endif

.PHONY: all bins text deps deps-build deps-deb test test-unit test-shell test-asan test-tsan bench bench-http bench-http-turns demo install uninstall deb clean \
        fuzz fuzz-build fuzz-bins
all: $(BINS) $(TEST_BINS)

deps:
	@sh tests/tools/deps.sh $(DEB_PKGS)
	@command -v node >/dev/null 2>&1 || sh tests/tools/deps.sh $(DEB_PKGS_NODE)

deps-build:
	@sh tests/tools/deps.sh $(DEB_PKGS_BUILD)

deps-deb:
	@sh tests/tools/deps.sh $(DEB_PKGS_BUILD) $(DEB_PKGS_DEB)

$(PROTO_GEN) &: proto/llamad.proto
	@mkdir -p $(BUILD)/proto
	protoc-c --proto_path=proto --c_out=$(BUILD)/proto proto/llamad.proto

$(BUILD)/proto/llamad.pb-c.o: $(BUILD)/proto/llamad.pb-c.c
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -c $< -o $@

$(SPM_GEN) &: proto/sentencepiece_model.proto
	@mkdir -p $(BUILD)/proto
	protoc-c --proto_path=proto --c_out=$(BUILD)/proto proto/sentencepiece_model.proto

$(BUILD)/proto/sentencepiece_model.pb-c.o: $(BUILD)/proto/sentencepiece_model.pb-c.c
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -c $< -o $@

$(PROTO_LIB): $(PROTO_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/%.o: %.c | $(PROTO_GEN) $(SPM_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(PKG_CFLAGS) $(CFLAGS) -c $< -o $@

# The hot loops of kernels/ start on 64-byte boundaries, so their speed does
# not depend on where the linker happens to place them: on the AMD EPYC
# machine kind, the f32 matmul ran ~20 % slower when unrelated daemon code
# moved it by 16 bytes (docs/PERF.md, 2026-12-01).
KERNEL_ALIGN ?= -falign-functions=64 -falign-loops=64
# kernels/ may be built by another compiler (the fuzz build compiles them
# with gcc, uninstrumented: clang 14 lacks __builtin_cpu_supports("f16c")).
KERNEL_CC     ?= $(CC)
KERNEL_CFLAGS ?= $(CFLAGS)
$(BUILD)/kernels/%.o: kernels/%.c | $(PROTO_GEN) $(SPM_GEN)
	@mkdir -p $(dir $@)
	$(KERNEL_CC) $(CPPFLAGS) $(PKG_CFLAGS) $(KERNEL_CFLAGS) $(KERNEL_ALIGN) -c $< -o $@

$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.cuh kernels/cuda/*.h) kernels/backend.h util/dtype.h
	$(cuda_say)
	@mkdir -p $(dir $@)
	$(NVCC) -I. -DLLAMAD_CUDA $(NVCCFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(PKG_CFLAGS) $(CXXFLAGS) -c $< -o $@

$(CORE_LIB): $(CORE_OBJ)
$(TEXT_LIB): $(TEXT_OBJ)
$(FORMAT_LIB): $(FORMAT_OBJ)
$(UTIL_LIB): $(UTIL_OBJ)
$(CORE_LIB) $(TEXT_LIB) $(FORMAT_LIB) $(UTIL_LIB):
	@rm -f $@
	$(AR) rcs $@ $^

text: $(TEXT_LIBS) $(TEXT_TESTS)

$(BUILD)/llamad: $(DAEMON_OBJ) $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(DAEMON_LDLIBS) $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamactl: $(CLIENT_OBJ) $(PROTO_LIB) $(UTIL_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(CLIENT_LDLIBS) $(PROTO_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-http: $(GW_OBJ) $(PROTO_LIB) $(UTIL_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(GW_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-genmodel: $(BUILD)/tests/tools/genmodel.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-quantize: $(BUILD)/quantize/quantize.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-bench: $(BUILD)/tests/bench/bench.o $(BUILD)/tests/bench/shift.o \
		$(BUILD)/tests/bench/prefill.o $(BUILD)/tests/bench/kl.o \
		$(BUILD)/tests/bench/optime.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-kvq: $(BUILD)/tests/bench/kv_quality.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-gpucheck: $(BUILD)/tests/gpu/check.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-load: $(BUILD)/tests/load/load.o $(PROTO_LIB) $(UTIL_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(PROTO_LDLIBS) $(LDLIBS)

$(BUILD)/llamad-bench-daemon: $(BUILD)/tests/bench/daemon_bench.o $(PROTO_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(PROTO_LDLIBS) $(LDLIBS)

$(BUILD)/tests/test_gateway: $(GW_PURE_OBJ)
# the gateway's request framing, against libevent's server
$(BUILD)/tests/test_reqscan: $(BUILD)/tests/unit/test_reqscan.o $(BUILD)/gateway/reqscan.o
	$(CC) $(LDFLAGS) -o $@ $^ $(GW_LDLIBS) -lcmocka $(LDLIBS)
# the step's fair shares (pure arithmetic)
$(BUILD)/tests/test_fair: $(BUILD)/tests/unit/test_fair.o $(BUILD)/daemon/fair.o
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka -lm $(LDLIBS)
# the request checks, linked before the libraries they use
$(BUILD)/tests/test_validate: $(BUILD)/tests/unit/test_validate.o $(BUILD)/daemon/validate.o $(MODEL_LIBS)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) -lcmocka $(LDLIBS)

$(TEXT_TESTS): $(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(TEXT_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(TEXT_LDLIBS) -lcmocka $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(MODEL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(CORE_LDLIBS) -lcmocka $(LDLIBS)

# The unit tests' objects are made by the pattern rules above only: without
# this, make deletes them as intermediates after linking, and the next make
# (make demo or make test after make) compiles all of them again, since
# their .d files then name them.
.SECONDARY: $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/unit/%.o)

# ---- tests -----------------------------------------------------------------

# tests/run.sh picks what runs: LAYERS (unit, shell) or T (one test by name);
# the fuzz targets run only in the whole `make test`.
test: deps
	@$(MAKE) --no-print-directory all
	@$(if $(T),true,$(MAKE) --no-print-directory fuzz-build)
	@MODELS=$(MODELS) SHARED=$(SHARED) BUILD=$(BUILD) FUZZ_BUILD=$(if $(T),,$(FUZZ_BUILD)) \
	    FUZZ_TIME=$(TEST_FUZZ_TIME) T=$(T) sh tests/run.sh

test-unit test-shell: deps
	@$(MAKE) --no-print-directory all
	@MODELS=$(MODELS) SHARED=$(SHARED) BUILD=$(BUILD) FUZZ_BUILD= T= \
	    LAYERS=$(@:test-%=%) sh tests/run.sh

test-asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 CUDA=0 \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" all
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    MODELS=$(MODELS) SHARED=$(SHARED) BUILD=build-asan FUZZ_BUILD= T=$(T) sh tests/run.sh

# ThreadSanitizer over the daemon's threads (tests/tsan.sh), built with clang
# into build-tsan (kernels/ with gcc, uninstrumented, as in the fuzz build).
test-tsan: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan CC=clang CXX=clang++ OPT=-O1 CUDA=0 \
	    SAN="-fsanitize=thread -fno-omit-frame-pointer" WARN="-Wall -Wextra" KERNEL_CC=gcc \
	    KERNEL_CFLAGS="-std=c11 -O1 $(ARCH) -g -Wall -Wextra -pthread -MMD -MP" \
	    build-tsan/llamad build-tsan/llamactl build-tsan/llamad-genmodel \
	    build-tsan/tests/test_daemon build-tsan/tests/test_persist
	@MODELS=$(MODELS) SHARED=$(SHARED) BUILD=build-tsan sh tests/tsan.sh

# ---- fuzzing ------------------------------------------------------------------
# tests/fuzz/fuzz_*.c: libFuzzer targets. The core and proto libraries are
# rebuilt with clang, ASan and UBSan in $(FUZZ_BUILD) by a recursive make;
# each target links them with -fsanitize=fuzzer. `make fuzz` runs each for
# FUZZ_TIME seconds from the seeds in tests/fuzz/corpus/<target>/; crashing
# inputs land in $(FUZZ_BUILD)/crashes/. `make test` runs them TEST_FUZZ_TIME s.
# kernels/ are compiled with gcc and no sanitizer there: they are not what
# the targets exercise, and clang 14 does not build them. Warnings are not
# errors there (the gcc build enforces them).

FUZZ_BUILD     ?= build-fuzz
FUZZ_TIME      ?= 60
TEST_FUZZ_TIME ?= 20
FUZZ_TARGETS   := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SAN       := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
                  -fno-sanitize-recover=all

fuzz-build: deps
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang CXX=clang++ OPT=-O1 CUDA=0 \
	    SAN="$(FUZZ_SAN)" WARN="-Wall -Wextra" KERNEL_CC=gcc \
	    KERNEL_CFLAGS="-std=c11 -O1 $(ARCH) -g -Wall -Wextra -pthread -MMD -MP" fuzz-bins

fuzz: fuzz-build
	@MODELS=$(MODELS) FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_TIME=$(FUZZ_TIME) sh tests/fuzz/run.sh

fuzz-bins: $(FUZZ_TARGETS:%=$(BUILD)/%)

# linked by the C++ driver: UBSan's C++ runtime, for the tokenizer shim.
# The text/ targets link the text libraries only (no weight loaders).
TEXT_FUZZ := $(patsubst %,$(BUILD)/%,fuzz_tokenizer fuzz_bpe fuzz_template)
.SECONDARY: $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/%.o)
$(TEXT_FUZZ): $(BUILD)/%: $(BUILD)/tests/fuzz/%.o $(TEXT_LIBS)
	$(CXX) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(TEXT_LDLIBS) $(LDLIBS)
$(BUILD)/fuzz_http: $(GW_PURE_OBJ)
$(BUILD)/fuzz_head: $(BUILD)/gateway/reqscan.o
$(BUILD)/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/daemon/validate.o $(MODEL_LIBS)
	$(CXX) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(CORE_LDLIBS) $(LDLIBS)

# ---- bench, demo -------------------------------------------------------------

# llamad-http's costs (added latency per streamed token, memory with 100
# streams): its own target, not part of the routine bench
bench-http: deps-build
	@$(MAKE) --no-print-directory all
	@MODELS=$(MODELS) BUILD=$(BUILD) sh tests/bench/http.sh

# eight stateless conversations to ~2,000 tokens through llamad-http (and
# LLAMA_SERVER=path/to/llama-server beside it): long, its own target
bench-http-turns: deps-build
	@$(MAKE) --no-print-directory all
	@MODELS=$(MODELS) BUILD=$(BUILD) LLAMA_SERVER=$(LLAMA_SERVER) sh tests/bench/http_turns.sh

bench: deps-build
	@$(MAKE) --no-print-directory all
	@MODELS=$(MODELS) BUILD=$(BUILD) sh tests/bench/run.sh

demo: deps-build
	@$(MAKE) --no-print-directory all
	@MODELS=$(MODELS) BUILD=$(BUILD) sh tests/tools/demo.sh

# ---- install -----------------------------------------------------------------
# PREFIX=/usr/local DESTDIR= (and SYSCONFDIR=/etc, SYSTEMDUNITDIR): the
# binaries, man pages, systemd units (ExecStart in PREFIX), sysusers.d and
# tmpfiles.d entries, the sample config (never over an existing one), the
# .proto and the editor packages. Paths under /usr/local in the units and
# man pages become PREFIX's. Run as root without DESTDIR, it also makes the
# llamad user and /var/lib/llamad (systemd-sysusers, systemd-tmpfiles) and
# reloads systemd, unless SYSTEM_SETUP=no. NOBUILD=1 installs what $(BUILD)
# holds without building (a sanitizer build is not relinked without its
# flags). `make uninstall` (same variables) removes the files, the config
# only if unchanged.

SYSCONFDIR     ?= /etc
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
INSTALL_BINS   := llamad llamactl llamad-quantize llamad-http
MAN_PAGES      := $(wildcard man/*.[1-8])
I_BIN      = $(DESTDIR)$(PREFIX)/bin
I_SHARE    = $(DESTDIR)$(PREFIX)/share
I_UNITS    = $(DESTDIR)$(SYSTEMDUNITDIR)
I_SYSUSERS = $(DESTDIR)$(PREFIX)/lib/sysusers.d
I_TMPFILES = $(DESTDIR)$(PREFIX)/lib/tmpfiles.d
I_CONF     = $(DESTDIR)$(SYSCONFDIR)/llamad
NVIM_FILES  = plugin/llamad.lua lua/llamad/init.lua lua/llamad/conn.lua lua/llamad/pb.lua \
              doc/llamad.txt
EMACS_FILES = llamad.el llamad-proto.el
# llamad.service and .socket made into the llamad@NAME template units
INSTANCE_UNIT = sed -e 's|\(--config .*/\)llamad\.conf|\1%i.conf|' \
                    -e 's|^StateDirectory=llamad$$|StateDirectory=llamad/%i|' \
                    -e 's|/run/llamad/llamad.sock|/run/llamad/%i.sock|' \
                    -e 's|^Description=\(.*\)|Description=\1, model %i|' \
                    -e 's|^Service=llamad.service|Service=llamad@%i.service|' \
                    -e 's|^Also=llamad.socket|Also=llamad@%i.socket|' \
                    -e '1s,^\# llamad\.\(service\|socket\) — ,\# llamad@.\1 (made from llamad.\1 by make install) — ,'
PREFIXED    = sed -e 's|/usr/local/|$(PREFIX)/|g' -e 's|/etc/llamad/|$(SYSCONFDIR)/llamad/|g'

bins: $(BINS)

install: $(if $(NOBUILD),,bins)
	install -d $(I_BIN) $(I_SHARE)/llamad $(I_UNITS) $(I_SYSUSERS) $(I_TMPFILES) $(I_CONF)
	install -m 0755 $(INSTALL_BINS:%=$(BUILD)/%) $(I_BIN)/
	install -m 0644 proto/llamad.proto $(I_SHARE)/llamad/
	for p in $(MAN_PAGES); do s=$${p##*.}; install -d $(I_SHARE)/man/man$$s; \
	    $(PREFIXED) "$$p" > $(I_SHARE)/man/man$$s/$${p##*/}; \
	    chmod 0644 $(I_SHARE)/man/man$$s/$${p##*/}; done
	for u in llamad.service llamad.socket llamad-http.service llamad-http.socket; do \
	    $(PREFIXED) etc/$$u > $(I_UNITS)/$$u; chmod 0644 $(I_UNITS)/$$u; done
	# one llamad per model: llamad@NAME (/etc/llamad/NAME.conf, its own
	# socket and state directory), made from llamad's units
	$(PREFIXED) etc/llamad.service | $(INSTANCE_UNIT) > $(I_UNITS)/llamad@.service
	$(PREFIXED) etc/llamad.socket | $(INSTANCE_UNIT) > $(I_UNITS)/llamad@.socket
	chmod 0644 $(I_UNITS)/llamad@.service $(I_UNITS)/llamad@.socket
	install -m 0644 etc/llamad.sysusers $(I_SYSUSERS)/llamad.conf
	install -m 0644 etc/llamad.tmpfiles $(I_TMPFILES)/llamad.conf
	[ -f $(I_CONF)/llamad.conf ] || install -m 0644 etc/llamad.conf $(I_CONF)/
	# editors: a Neovim package on the default packpath, the Emacs package
	# in site-lisp (both on the editors' own paths for PREFIX /usr/local, /usr)
	for f in $(NVIM_FILES); do install -D -m 0644 client/nvim/$$f $(NVIM_PACK)/$$f; done
	! command -v nvim >/dev/null 2>&1 || \
	    nvim --headless -u NONE -i NONE -c 'helptags $(NVIM_PACK)/doc' -c 'qall!' >/dev/null 2>&1 || true
	install -d $(I_SHARE)/emacs/site-lisp
	install -m 0644 $(EMACS_FILES:%=client/emacs/%) $(I_SHARE)/emacs/site-lisp/
	# installed for real (no DESTDIR, as root): make the user and the state
	# directory now and tell systemd about the units (SYSTEM_SETUP=no: not)
	if [ -z "$(DESTDIR)" ] && [ "$(SYSTEM_SETUP)" != no ] && [ "$$(id -u)" -eq 0 ]; then \
	    systemd-sysusers $(I_SYSUSERS)/llamad.conf && \
	    systemd-tmpfiles --create $(I_TMPFILES)/llamad.conf; \
	    [ ! -d /run/systemd/system ] || systemctl daemon-reload; fi

uninstall:
	rm -f $(INSTALL_BINS:%=$(I_BIN)/%) $(I_SHARE)/llamad/llamad.proto \
	    $(I_UNITS)/llamad.service $(I_UNITS)/llamad.socket \
	    $(I_UNITS)/llamad-http.service $(I_UNITS)/llamad-http.socket \
	    $(I_UNITS)/llamad@.service $(I_UNITS)/llamad@.socket \
	    $(I_SYSUSERS)/llamad.conf $(I_TMPFILES)/llamad.conf \
	    $(NVIM_FILES:%=$(NVIM_PACK)/%) $(NVIM_PACK)/doc/tags \
	    $(EMACS_FILES:%=$(I_SHARE)/emacs/site-lisp/%)
	for p in $(MAN_PAGES); do rm -f $(I_SHARE)/man/man$${p##*.}/$${p##*/}; done
	! cmp -s etc/llamad.conf $(I_CONF)/llamad.conf || rm -f $(I_CONF)/llamad.conf
	rmdir $(I_SHARE)/llamad $(I_CONF) $(NVIM_PACK)/plugin $(NVIM_PACK)/lua/llamad \
	    $(NVIM_PACK)/lua $(NVIM_PACK)/doc $(NVIM_PACK) $(dir $(NVIM_PACK)) \
	    $(dir $(patsubst %/,%,$(dir $(NVIM_PACK)))) 2>/dev/null || true

# ---- Debian package -------------------------------------------------------------
# make deb: the Debian package (debian/, debhelper), built with
# dpkg-buildpackage from a copy of the tracked files in $(BUILD)/deb/;
# the .deb lands there. CUDA=0 leaves the CUDA backend out. The copy is
# built from nothing (debian/rules: its own build-deb/, the programs only,
# one job): nothing of $(BUILD) is reused, so with nvcc found the CUDA
# backend is compiled a second time. What it costs is said first
# (docs/PERF.md, "Build cost").
DEB_VERSION = $(shell awk 'NR == 1 { gsub(/[()]/, "", $$2); print $$2 }' debian/changelog)
DEB_COST := about 1 min of CPU
DEB_NOTE  = make deb: dpkg-buildpackage builds its own copy in $(BUILD)/deb/ (nothing of $(BUILD)/ is reused),
ifeq ($(HAVE_CUDA),1)
  DEB_NOTE += with the CUDA backend: $(DEB_COST), plus $(CUDA_COST) for nvcc (CUDA=0 leaves it out)
else
  DEB_NOTE += without the CUDA backend: $(DEB_COST)
endif

deb: deps-deb
	@echo "$(DEB_NOTE)"
	rm -rf $(BUILD)/deb && mkdir -p $(BUILD)/deb/llamad-$(DEB_VERSION)
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then git ls-files -z; else \
	    find . \( -path './build*' -o -path ./.git -o -path ./gpu-pack \) -prune -o \
	        \( -type f -o -type l \) -print0; fi | \
	    xargs -0 tar -cf - | tar -xf - -C $(BUILD)/deb/llamad-$(DEB_VERSION)
	cd $(BUILD)/deb/llamad-$(DEB_VERSION) && $(if $(filter 0,$(CUDA)),CUDA=0) \
	    dpkg-buildpackage -b -us -uc
	@ls $(BUILD)/deb/*.deb

clean:
	rm -rf $(BUILD) build-asan build-tsan $(FUZZ_BUILD)

-include $(shell find $(BUILD) -path '$(BUILD)/deb' -prune -o -name '*.d' -type f -print 2>/dev/null)
