# neurocache -- adaptive LSTM language-model prediction server.
# Targets: deps deps-test all test bench asan tsan fuzz run soak endurance demo-model
# container-test clean. V=1 for verbose.

CC       ?= cc
BUILD    ?= build
BIN      ?= bin
OPT      ?= -O2 -march=x86-64-v2 -g
SANFLAGS ?=
CFLAGS   += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE $(OPT) $(SANFLAGS) -MMD -MP
# Include paths per folder keep the layering in the build: a folder sees its
# own headers and those of the folders below it, so `#include "server.h"` in
# a core file, or `#include "stream.h"` in core/model, does not compile
# (tests/check_layering.sh proves each rule with a planted include).
# core's parts, bottom up (docs/design.md §1): files, faults and memory;
# vector kernels and generators; text; the knob table; the FAISS index
# kernels; the components and their mixture; the model; a session's stream.
INC_core_base       := -Icore/base
INC_core_numerics   := -Icore/numerics $(INC_core_base)
INC_core_text       := -Icore/text $(INC_core_numerics)
INC_core_knobs      := -Icore/knobs $(INC_core_text)
INC_core_index      := -Icore/index $(INC_core_knobs)
INC_core_components := -Icore/components $(INC_core_index)
INC_core_model      := -Icore/model $(INC_core_components)
INC_core_session    := -Icore/session $(INC_core_model)
INC_core   := $(INC_core_session)
# store and proto sit on core; tools (the CLI) on proto and core
INC_store  := -Istore $(INC_core)
INC_proto  := -Iproto $(INC_core)
INC_tools  := -Itools -Iproto $(INC_core)
# the server's tiers, bottom up (design §1): what every tier shares (the
# server's state, config, log, metrics, the worker pool), the net (HTTP,
# SSE, keys, the page), the domain (sessions, namespaces, uploads, ...),
# replication, the API handlers; routes.c and main.c on top see them all
INC_server_common      := -Iserver/common -Istore $(INC_proto)
INC_server_net         := -Iserver/net $(INC_server_common)
INC_server_domain      := -Iserver/domain $(INC_server_net)
INC_server_replication := -Iserver/replication $(INC_server_domain)
INC_server_api         := -Iserver/api $(INC_server_replication)
INC_server := -Iserver $(INC_server_api)
INC_tests  := -Itests $(INC_server)
INC_tests_component := $(INC_tests)
INC_gen    := $(INC_server)
LDFLAGS  += $(SANFLAGS)
CXX      ?= g++
# -fno-sanitize=vptr: UBSan's dynamic-type check needs its C++ runtime, which
# the C link (cc) of the programs does not bring
# -ffp-contract=off: as C11 has it (no a * b + c fused into one rounding
# unless written so): GNU C++ fuses by default where the target has FMA, so
# faiss_shim.cpp's AVX2/AVX-512 kernels would round differently from its
# plain ones, which must give the same bits at every level
CXXFLAGS += -std=c++17 -ffp-contract=off -Wall -Wextra -Werror $(OPT) $(SANFLAGS) -fno-sanitize=vptr -MMD -MP -I.

FAISS_C  := build/faiss_c/libfaiss_c.a
# FAISS's distance and IVFPQ kernels recompiled for this CPU by deps.sh
# (FAISS_SIMD=auto|avx2|none); taken whole, so Debian's generic copies in
# libfaiss.a are never linked. Empty when FAISS_SIMD=none.
FAISS_SIMD_LIB := build/faiss_c/libfaiss_simd.a
BLAS_LIBS := -lopenblas -llapack
LIBS_CORE := $(FAISS_C) -Wl,--whole-archive $(FAISS_SIMD_LIB) -Wl,--no-whole-archive -lfaiss $(BLAS_LIBS) \
             -ljansson -lunistring -lz -lgomp -lstdc++ -lm -lpthread
LIBS_SERVER := -lmicrohttpd -linih -lhiredis -lsystemd -lcurl
LIBS_TEST := -lcurl -lyaml

ifeq ($(V),1)
Q :=
else
Q := @
endif

CORE_SRC   := $(wildcard core/*/*.c)
# The test build's components (core/knobs/component_table.h): NC_PROBE=1 builds
# the whole program with each tests/component/<name>.c as one more row, in
# its own tree (make test: build/probe; their suites tests/component/test_*.c).
PROBE_COMPONENTS := $(filter-out tests/component/test_%.c,$(wildcard tests/component/*.c))
PROBE_SUITES := $(patsubst tests/%.c,build/probe/tests/%,$(wildcard tests/component/test_*.c))
ifeq ($(NC_PROBE),1)
CFLAGS   += -DNC_COMPONENT_PROBE
CORE_SRC += $(PROBE_COMPONENTS)
endif
# C++ of our own where FAISS's C API stops (core/index/faiss_shim.cpp)
CORE_CXX_SRC := $(wildcard core/*/*.cpp)
STORE_SRC  := $(wildcard store/*.c)
PROTO_SRC  := $(wildcard proto/*.c)
SERVER_SRC := $(wildcard server/*.c server/*/*.c)
TOOLS_SRC  := $(wildcard tools/*.c)
TEST_SRC   := $(wildcard tests/test_*.c)
BENCH_SRC  := $(wildcard tests/bench_*.c)
TESTLIB_SRC := $(filter-out tests/test_%.c tests/bench_%.c tests/fuzz_%.c tests/soak.c,$(wildcard tests/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
CORE_OBJ   := $(call obj,$(CORE_SRC)) $(patsubst %.cpp,$(BUILD)/obj/%.o,$(CORE_CXX_SRC))
STORE_OBJ  := $(call obj,$(STORE_SRC))
PROTO_OBJ  := $(call obj,$(PROTO_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
TOOLS_OBJ  := $(call obj,$(TOOLS_SRC))
TESTLIB_OBJ := $(call obj,$(TESTLIB_SRC))
TEST_BINS  := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(BENCH_SRC))

LIBCORE  := $(BUILD)/libneurocache.a
LIBSTORE := $(BUILD)/libncstore.a
LIBPROTO := $(BUILD)/libncproto.a
SERVER_MAIN_OBJ := $(filter %/server/main.o,$(SERVER_OBJ))
SERVER_LIB_OBJ := $(filter-out %/server/main.o,$(SERVER_OBJ))
# The page at GET / (server/net/web.h): web/* compiled in as a generated C file.
WEB_FILES := $(sort $(wildcard web/*))
WEB_GEN   := $(BUILD)/gen/web_assets.c
WEB_OBJ   := $(BUILD)/obj/gen/web_assets.o
LIBSERVER := $(BUILD)/libncserver.a

.PHONY: all deps deps-test container-test test check asan tsan bench fuzz run soak endurance demo-model clean tests print-inc

# The include flags of a folder (tests/check_layering.sh compiles probes with them).
print-inc:
	@echo $(INC_$(DIR))
.DEFAULT_GOAL := all

all: $(BIN)/neurocache $(if $(SERVER_MAIN_OBJ),$(BIN)/neurocached)

# deps: what building and serving need (Debian packages, FAISS's C API);
# deps-test: that and the test rig (clang, haproxy, nginx, redis, chromium,
# node modules). scripts/deps.sh lists both; README.md repeats the lists.
deps:
	$(Q)bash scripts/deps.sh server

deps-test:
	$(Q)bash scripts/deps.sh test

$(FAISS_C):
	$(Q)bash scripts/deps.sh server

$(FAISS_SIMD_LIB): $(FAISS_C)
	$(Q)bash scripts/deps.sh server

# a source's include flags: its folder's (core/model/lstm -> INC_core_model)
inc_of = $(INC_$(subst /,_,$(patsubst %/,%,$(dir $(1)))))

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(call inc_of,$*) -c $< -o $@

$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(CXXFLAGS) $(call inc_of,$*) -c $< -o $@

$(LIBCORE): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBSTORE): $(STORE_OBJ)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBPROTO): $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^ $(if $^,,--)

$(WEB_GEN): $(WEB_FILES) scripts/embed_web.sh
	$(Q)bash scripts/embed_web.sh $@ $(WEB_FILES)

$(WEB_OBJ): $(WEB_GEN)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(INC_gen) -c $< -o $@

$(LIBSERVER): $(SERVER_LIB_OBJ) $(WEB_OBJ)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN)/neurocache: $(TOOLS_OBJ) $(LIBPROTO) $(LIBCORE) $(FAISS_C) $(FAISS_SIMD_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $(TOOLS_OBJ) $(LIBPROTO) $(LIBCORE) $(LIBS_CORE) -lcurl -o $@

$(BIN)/neurocached: $(SERVER_MAIN_OBJ) $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(FAISS_C) $(FAISS_SIMD_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $(SERVER_MAIN_OBJ) $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(LIBS_SERVER) $(LIBS_CORE) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TESTLIB_OBJ) $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(FAISS_C) $(FAISS_SIMD_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $< $(TESTLIB_OBJ) $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(LIBS_TEST) $(LIBS_SERVER) $(LIBS_CORE) -o $@

tests: all $(TEST_BINS) $(BUILD)/tests/soak

# libFuzzer harnesses (tests/fuzz_*.c) link clang's fuzzer main; they are
# built only by `make fuzz`, in their own tree.
$(BUILD)/tests/fuzz_%: $(BUILD)/obj/tests/fuzz_%.o $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(FAISS_C) $(FAISS_SIMD_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer $< $(LIBSERVER) $(LIBSTORE) $(LIBPROTO) $(LIBCORE) $(LIBS_SERVER) $(LIBS_CORE) -o $@

# Every test binary prints "N passed, N failed"; run_tests.sh sums them and
# fails if any binary fails. Tests find binaries through NEUROCACHE_BIN.
# Every suite runs once as the machine is (the best kernels, OpenBLAS's own
# choice); then the suites with floating-point results run again at each
# kernel level the CPU supports (run_levels.sh), so an AVX-512 machine also
# proves the AVX2 and scalar paths. NEUROCACHE_SIMD=scalar make test forces
# one level for the first pass as well.
# Checks of the source itself (layering, function length, the lock list of
# docs/threads.md), each printing "N passed, N failed" like a test binary.
CHECK_SCRIPTS := $(sort $(wildcard tests/check_*.sh))
NUMERIC_TESTS := lstm cache cache_ref scan cache_cli score train model model_errors namespace gate vocab_modes
NUMERIC_BINS := $(patsubst %,$(BUILD)/tests/test_%,$(NUMERIC_TESTS))
PROBE_TREE := BUILD=build/probe BIN=build/probe/bin NC_PROBE=1
PROBE_BINS := build/probe/bin/neurocached build/probe/bin/neurocache $(PROBE_SUITES)
test: deps-test
	$(Q)$(MAKE) --no-print-directory tests
	$(Q)$(MAKE) --no-print-directory $(PROBE_TREE) $(PROBE_BINS)
	$(Q)NEUROCACHE_BIN=$(abspath $(BIN)) BUILD=$(BUILD) bash tests/run_tests.sh $(TEST_BINS) $(CHECK_SCRIPTS)
	$(Q)NEUROCACHE_BIN=$(abspath build/probe/bin) bash tests/run_tests.sh $(PROBE_SUITES)
	$(Q)NEUROCACHE_BIN=$(abspath $(BIN)) bash tests/run_levels.sh $(NUMERIC_BINS)

check: test

# AddressSanitizer + UndefinedBehaviorSanitizer build of everything, in its
# own tree, running the same suites.
asan: deps-test
	$(Q)$(MAKE) --no-print-directory BUILD=build/asan BIN=build/asan/bin CC=clang CXX=clang++ \
	    OPT="-O1 -g -fno-omit-frame-pointer" \
	    SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" tests
	$(Q)ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	    NEUROCACHE_BIN=$(abspath build/asan/bin) NEUROCACHE_SANITIZED=1 \
	    bash tests/run_tests.sh $(patsubst $(BUILD)/%,build/asan/%,$(TEST_BINS))

# ThreadSanitizer build (clang -fsanitize=thread), in its own tree, running
# the suites that drive the daemon's threads (docs/threads.md), and
# test_scratch (the per-thread scratch buffers' threads and exits). Every
# process writes its reports to build/tsan/reports/ (the daemon runs as a
# child of the tests, so its stderr alone would be lost); the target fails
# when any report was written, and prints them. tests/tsan.supp names the
# libraries whose own threads TSan cannot see synchronise (OpenMP, OpenBLAS).
# test_server_guard is not among them: its checks are the latency bounds of
# an acceptance (a refusal within 50 ms, an exit within drain_timeout + 2 s),
# which TSan's 5-15x slowdown breaks without a race (it reported none).
TSAN_TESTS := server server_stream server_batcher namespace_server namespace replication replicas wal scratch
TSAN_BINS := $(patsubst %,build/tsan/tests/test_%,$(TSAN_TESTS))
tsan: deps-test
	$(Q)$(MAKE) --no-print-directory BUILD=build/tsan BIN=build/tsan/bin CC=clang \
	    OPT="-O1 -g -fno-omit-frame-pointer" SANFLAGS="-fsanitize=thread" \
	    build/tsan/bin/neurocache build/tsan/bin/neurocached $(TSAN_BINS)
	$(Q)rm -rf build/tsan/reports && mkdir -p build/tsan/reports
	$(Q)TSAN_OPTIONS="log_path=$(abspath build/tsan/reports)/tsan second_deadlock_stack=1 suppressions=$(abspath tests/tsan.supp)" \
	    OMP_NUM_THREADS=1 NEUROCACHE_BIN=$(abspath build/tsan/bin) NEUROCACHE_SANITIZED=1 \
	    bash tests/run_tests.sh $(TSAN_BINS); rc=$$?; \
	    n=$$(ls build/tsan/reports | wc -l); \
	    if [ "$$n" -gt 0 ]; then cat build/tsan/reports/*; echo "tsan: $$n process(es) reported (build/tsan/reports)"; exit 1; fi; \
	    echo "tsan: no reports"; exit $$rc

# Fuzzing: every tests/fuzz_*.c under libFuzzer + ASan + UBSan for
# FUZZ_SECONDS each, from its committed seeds (tests/fuzz/corpus/<name>);
# new inputs go to build/fuzz/corpus/<name>, crashes to build/fuzz/artifacts.
# `make test` replays the committed corpora (test_fuzz_replay).
FUZZ_SECONDS ?= 60
FUZZ_NAMES := $(patsubst tests/%.c,%,$(wildcard tests/fuzz_*.c))
fuzz: deps-test
	$(Q)$(MAKE) --no-print-directory BUILD=build/fuzz BIN=build/fuzz/bin CC=clang CXX=clang++ \
	    OPT="-O1 -g -fno-omit-frame-pointer" \
	    SANFLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	    $(addprefix build/fuzz/tests/,$(FUZZ_NAMES))
	$(Q)bash scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_NAMES)

# Benchmarks: every scripts/bench_*.sh in name order (each says when the
# corpora in ../shared/data are absent). Results go to BENCHMARKS.md by hand.
bench: deps-test
	$(Q)$(MAKE) --no-print-directory all $(BENCH_BINS)
	$(Q)for b in scripts/bench_*.sh; do [ -f "$$b" ] || continue; \
	    echo "== $$b"; BUILD=$(BUILD) BIN=$(BIN) bash "$$b" || exit 1; done

# Soak test (tests/soak.c): the real daemon on loopback under SOAK_CLIENTS
# concurrent clients of mixed traffic for SOAK_SECONDS; fails on any 5xx or
# memory growth over 2% after warm-up (RSS less the namespaces' entries),
# saying what grew. Uses models/demo (or the run in progress) when present.
SOAK_SECONDS ?= 600
SOAK_CLIENTS ?= 16
SOAK_MODEL ?= $(firstword $(wildcard models/demo runs/demo) $(abspath tests/fixtures/lstm-2layer))
SOAK_ARGS ?=
soak: deps-test all $(BUILD)/tests/soak
	$(Q)NEUROCACHE_BIN=$(abspath $(BIN)) $(BUILD)/tests/soak --seconds $(SOAK_SECONDS) \
	    --clients $(SOAK_CLIENTS) --model $(SOAK_MODEL) $(SOAK_ARGS)

# Endurance (not in `make test`; docs/operations.md#endurance): the fault
# schedule of tests/test_replica_faults.c (three replicas, Redis, HAProxy) for
# ENDURANCE_SECONDS, with backups restored into a spare daemon and compared
# and a full disk among its faults, and tests/soak.c's traffic on the
# replica that is never killed (its RSS the measure); fails on any
# acknowledged pair lost, duplicated or resurrected, a backup restoring to
# other predictions, or that replica's memory growing over 2%.
ENDURANCE_SECONDS ?= 600
ENDURANCE_ROUND_MS ?= 4000
ENDURANCE_CLIENTS ?= 4
ENDURANCE_SEED ?= 188
endurance: deps-test all $(BUILD)/tests/test_replica_faults $(BUILD)/tests/soak
	$(Q)NEUROCACHE_BIN=$(abspath $(BIN)) NEUROCACHE_ENDURANCE_SECONDS=$(ENDURANCE_SECONDS) \
	    NEUROCACHE_FAULT_ROUND_MS=$(ENDURANCE_ROUND_MS) NEUROCACHE_FAULT_SEEDS=$(ENDURANCE_SEED) \
	    NEUROCACHE_ENDURANCE_CLIENTS=$(ENDURANCE_CLIENTS) $(BUILD)/tests/test_replica_faults

# In the foreground on the shipped model, human-readable logs. As root (a
# container, a fresh VM) the daemon would refuse to start: say it is meant.
# OpenMP's idle threads sleep rather than spin (docs/design.md §6).
run: deps all
	$(Q)OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(BIN)/neurocached --model models/demo --log-format text \
	    $(if $(filter 0,$(shell id -u)),--allow-root) $(RUN_ARGS)

# The shipped demo model (docs/cli.md "Training"): PTB, 2x256 tied LSTM, PyTorch
# word_language_model recipe, 90 minutes of wall-clock. Resumable: an
# interrupted `make demo-model` continues from $(DEMO_RUN)/train-state.bin.
DEMO_DATA ?= ../shared/data/ptb
DEMO_RUN  ?= runs/demo
DEMO_TRAIN_ARGS ?= --emsize 256 --nhid 256 --nlayers 2 --tied --dropout 0.25 --bptt 35 --batch 20 \
    --optimizer sgd --lr 20 --clip 0.25 --epochs 40 --time-budget 90m --seed 1111 --save-f16 --plot
demo-model: all
	$(Q)if [ -f $(DEMO_RUN)/train-state.bin ]; then $(BIN)/neurocache train --resume $(DEMO_RUN) --plot; \
	else $(BIN)/neurocache train --train $(DEMO_DATA)/ptb.train.txt --valid $(DEMO_DATA)/ptb.valid.txt \
	    --out $(DEMO_RUN) $(DEMO_TRAIN_ARGS); fi
	$(Q)mkdir -p models/demo && cp $(DEMO_RUN)/config.json $(DEMO_RUN)/vocab.txt \
	    $(DEMO_RUN)/model.safetensors $(DEMO_RUN)/curve.csv $(DEMO_RUN)/curve.png models/demo/
	@# trained on text already in PTB's conventions; it declares them for ordinary text (docs/normalisation.md)
	$(Q)python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); \
	    c["text"]={"preset": "ptb"}; open(p, "w").write(json.dumps(c, indent=2) + "\n")' models/demo/config.json
	$(Q)$(BIN)/neurocache build-index --model models/demo --no-normalize --corpus $(DEMO_DATA)/ptb.train.txt --threads 2
	@# dynamic evaluation's gradient statistics of the new weights (docs/dyneval.md; BF16, ~7 MB)
	$(Q)rm -rf models/demo/dyneval && $(BIN)/neurocache dyn-stats --model models/demo \
	    --train $(DEMO_DATA)/ptb.train.txt --tokens 100000 --segment 20

# The container really built and run (scripts/container_test.sh): podman
# builds deploy/docker/Dockerfile on a debootstrapped Debian 12 base and runs
# it; /ready, a predict, a clean SIGTERM. Not part of `make test`: the image
# build takes many minutes on two cores. Skips, saying why, without podman.
container-test:
	$(Q)bash scripts/deps.sh container
	$(Q)bash scripts/container_test.sh

clean:
	rm -rf build/obj build/gen build/tests build/asan build/tsan build/*.a $(BIN)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
