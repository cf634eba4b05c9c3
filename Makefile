# ipccache - a cache of CUDA IPC mappings, loaded with LD_PRELOAD.
# Prerequisites: a C compiler, make, uthash (uthash-dev) and the CUDA headers
# (CUDA_HOME); the targets below install the Debian packages they miss when
# run as root, otherwise they print the command.
#
#   make                 build build/libipccache.so and build/ipccache-config
#   make help            this list
#   make test            run the test suite (no GPU needed)
#   make test-sanitize   the same under ASan + UBSan
#   make test-aarch64    the aarch64 build, its checks run under qemu-user
#   make check-exports   the library exports only the intercepted names
#   make fuzz            the differential fuzzer, SEEDS=1000 from FIRST=1
#   make mutants         one-spot bugs of shim/ (tests/fuzz/mutants.txt): each must be caught
#   make soak            a fleet on the stand-in for SOAK_MINUTES (5): every series flat, every value right
#   make test-gpu        prove it on a real GPU (without one: skipped, exit status 77)
#   make bench           benchmarks on a real GPU
#   make bench-standin   the RL weight sync's VMM calls on the stand-in: the library's own cost
#   make peer            PyTorch's and numba's own IPC tests, without and with the cache
#   make peer-fetch      SGLang's release and test, and vLLM's, verl's and OpenRLHF's weight-sync files,
#                        for PEER_SUITES=sglang|rl make peer and BENCH_PARTS=rl make bench (needs the network)
#   make demo            show the main job (simulated without a GPU)
#   make wheel           build/dist/ipccache-*.whl (pip install it)
#   make install         PREFIX=/usr/local DESTDIR=
#   make uninstall       remove what make install put there, and the folders it made
#   make clean           remove build/

CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
BUILD     ?= build
CC        ?= cc
SANITIZE  ?=

CFLAGS_BASE = -std=gnu11 -O2 -g -Wall -Wextra -Wshadow -Wmissing-prototypes \
              -fPIC -fvisibility=hidden -I$(CUDA_HOME)/include -Ishim $(SHIM_DIRS:%=-Ishim/%) $(SANITIZE)
CFLAGS     ?=
ALL_CFLAGS  = $(CFLAGS_BASE) $(CFLAGS)

# The library's layers, top to bottom: each folder one layer, declared once in
# shim/layers.txt (tests/tools/check_layers.py holds the calls to that order).
SHIM_DIRS := $(shell sed -e 's/\#.*//' shim/layers.txt)
SHIM_SRC = shim/entry/hooks.c shim/entry/resolve.c shim/entry/wiring.c \
           shim/legacy/legacy_calls.c shim/legacy/legacy_close.c shim/legacy/legacy_exporter.c \
           shim/legacy/legacy_give_way.c shim/legacy/legacy_exporter_teardown.c \
           shim/legacy/legacy_importer.c \
           shim/vmm/vmm_calls.c shim/vmm/vmm_close.c shim/vmm/vmm_exporter.c \
           shim/vmm/vmm_importer.c shim/vmm/vmm_identity.c shim/vmm/vmm_fds.c \
           $(LEGACY_TABLE) $(VMM_TABLE) $(LEDGER_SRC) shim/ledger/ledger_helper.c shim/ledger/ledger_let_go_ring.c \
           shim/budget/idle_budget.c shim/budget/budget_tables.c \
           shim/life/lifecycle.c shim/stats/stats.c shim/stats/marker.c \
           $(BASE_SRC) shim/base/lock.c shim/base/userdir.c shim/base/keyset.c shim/base/proc.c shim/base/driver.c \
           shim/base/mem.c shim/base/fdmark.c
# The pure tables (unit-tested without CUDA).
LEGACY_TABLE = shim/tables/legacy_table.c shim/tables/legacy_loans.c
VMM_TABLE    = shim/tables/vmm_table.c shim/tables/vmm_ranges.c shim/tables/vmm_predict.c
# The release ledger alone (unit-tested without CUDA).
LEDGER_SRC = shim/ledger/ledger.c shim/ledger/ledger_request.c shim/ledger/ledger_ended.c
# The settings parser and what it needs (also ipccache-config).
BASE_SRC   = shim/base/config.c shim/base/log.c shim/base/fmt.c
# The dlsym trampoline is assembly, one file per architecture.
ARCH     := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine 2>/dev/null)))
TRAMPOLINE = $(BUILD)/shim/entry/dlsym_$(ARCH).o
# A compiler that does not run says nothing of its target: name its package.
CC_NAME  = $(notdir $(firstword $(CC)))
CC_DEB_cc = build-essential
CC_DEB_gcc = build-essential
CC_DEB_aarch64-linux-gnu-gcc = gcc-aarch64-linux-gnu libc6-dev-arm64-cross
CC_DEB_x86_64-linux-gnu-gcc  = gcc-x86-64-linux-gnu libc6-dev-amd64-cross
ifeq ($(ARCH),)
$(error the C compiler $(CC) is not installed (or does not run)$(if $(CC_DEB_$(CC_NAME)),; on Debian or Ubuntu: apt-get install $(CC_DEB_$(CC_NAME))))
endif
ifeq ($(wildcard shim/entry/dlsym_$(ARCH).S),)
$(error ipccache supports x86_64 and aarch64; $(CC) targets $(ARCH))
endif
SHIM_OBJ = $(SHIM_SRC:%.c=$(BUILD)/%.o) $(TRAMPOLINE)
LIB      = $(BUILD)/libipccache.so
CONFIG_TOOL = $(BUILD)/ipccache-config
# What ships (library, ipccache-config) is bound to old glibc symbol versions.
FLOOR    = -include shim/base/glibc_floor.h

TEST_LIBS  = -lcriterion -ldl -lpthread
FAKE       = $(BUILD)/tests/libcuda.so.1
# tests/ by kind: standin/ (the stand-in driver), unit/, process/, tools/,
# fuzz/, gpu/, peer/; tests/one.sh runs one test or suite.
TEST_INC   = -Itests -Itests/standin -Itests/process
UNIT_SRC   = $(wildcard tests/unit/test_*.c)
E2E_SRC    = $(filter-out tests/process/test_process_%.c tests/process/test_ghost.c, \
                          $(wildcard tests/process/test_*.c))
TEST_BINS  = $(BUILD)/tests/test_unit $(BUILD)/tests/test_e2e $(BUILD)/tests/test_process \
             $(BUILD)/tests/probe $(BUILD)/tests/hello_tsan $(BUILD)/tests/vmm_errors \
             $(BUILD)/tests/test_ghost $(BUILD)/tests/ghost_peer $(BUILD)/tests/fuzz \
             $(BUILD)/tools/standin_rl $(BUILD)/tools/standin_hits \
             $(BUILD)/tests/soak $(BUILD)/tests/libsoakplant.so
INTERPOSERS = $(BUILD)/tests/libinterposer_next.so $(BUILD)/tests/libinterposer_handle.so \
              $(BUILD)/tests/libinterposer_getproc.so $(BUILD)/tests/libinterposer_resolver.so

.PHONY: all help prereqs test run-tests test-programs test-sanitize test-aarch64 test-gpu bench bench-standin peer peer-fetch fuzz mutants soak demo wheel \
        install uninstall clean check-exports

all: $(LIB) $(CONFIG_TOOL)

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

# The same check as make test, for the build alone: installs uthash when run
# as root, else prints the apt-get command and stops.
prereqs:
	@bash tests/setup.sh build

# -MMD -MP: each object depends on the headers it really includes.
$(BUILD)/shim/%.o: shim/%.c | prereqs
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -MMD -MP $(FLOOR) -c $< -o $@

-include $(SHIM_SRC:%.c=$(BUILD)/%.d)

# The pure tables know no CUDA, and the build proves it: they are compiled
# with CUDA's headers shadowed by ones that stop the build.
PURE_OBJ = $(LEGACY_TABLE:%.c=$(BUILD)/%.o) $(VMM_TABLE:%.c=$(BUILD)/%.o)
NO_CUDA  = $(BUILD)/no-cuda
CUDA_HEADERS = cuda.h cudaTypedefs.h cuda_runtime.h cuda_runtime_api.h driver_types.h
$(PURE_OBJ): ALL_CFLAGS = -I$(NO_CUDA) $(CFLAGS_BASE) $(CFLAGS)
$(PURE_OBJ): | $(NO_CUDA)/cuda.h
$(NO_CUDA)/cuda.h:
	@mkdir -p $(@D)
	@for h in $(CUDA_HEADERS); do \
	    echo '#error "a pure table includes no CUDA header"' >$(@D)/$$h; done

$(BUILD)/shim/entry/dlsym_%.o: shim/entry/dlsym_%.S
	@mkdir -p $(@D)
	$(CC) $(SANITIZE) -fPIC -c $< -o $@

# The export list: dlsym and each row of shim/base/hooks.def.
MAP = $(BUILD)/ipccache.map
$(MAP): shim/entry/ipccache.map.in shim/base/hooks.def
	@mkdir -p $(@D)
	$(CC) -E -P -x c -Ishim/base $< -o $@

# Only libdl/libpthread: the library must load where no driver is installed.
$(LIB): $(SHIM_OBJ) $(MAP)
	$(CC) -shared -o $@ $(SHIM_OBJ) $(SANITIZE) \
	    -Wl,--version-script=$(MAP) -Wl,-Bsymbolic-functions -Wl,-z,now \
	    -ldl -lpthread

# The library's settings parser as a command (ipccache-run checks with it).
# Static: it then runs on any glibc (an executable's start-up code needs the
# glibc it was linked with) and needs no library at all. --wrap: --check
# counts the library's messages.
$(CONFIG_TOOL): tools/ipccache_config.c $(BASE_SRC) $(wildcard shim/*.h shim/*/*.h) | prereqs
	@mkdir -p $(@D)
	$(CC) $(filter-out -fsanitize=% -fno-sanitize-recover=%,$(ALL_CFLAGS)) -static -o $@ \
	    tools/ipccache_config.c $(BASE_SRC) -Wl,--wrap=ipcc_log

# ---- tests ------------------------------------------------------------------

FAKE_SRC = tests/standin/fake_cuda.c tests/standin/fake_vmm.c
$(FAKE): $(FAKE_SRC) tests/standin/fake_cuda.h tests/standin/fake_vmm.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -I$(CUDA_HOME)/include $(SANITIZE) \
	    -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic-functions -o $@ $(FAKE_SRC) -lpthread
	ln -sf libcuda.so.1 $(@D)/libcuda.so

# The table, the settings parser, the ledger and the counters, tested alone: no CUDA, no
# preload. ipcc_mem_calloc is wrapped so that a test can make the table's allocations fail.
UNIT_SHIM = $(LEGACY_TABLE) $(VMM_TABLE) $(LEDGER_SRC) $(BASE_SRC) shim/base/userdir.c \
            shim/base/keyset.c shim/base/lock.c shim/base/proc.c shim/base/mem.c \
            shim/stats/stats.c shim/stats/marker.c
$(BUILD)/tests/test_unit: $(UNIT_SRC) $(UNIT_SHIM) $(wildcard shim/*.h shim/*/*.h)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -fvisibility=default -o $@ $(UNIT_SRC) $(UNIT_SHIM) \
	    -Wl,--wrap=ipcc_mem_calloc $(TEST_LIBS)

# Two libraries defining one symbol: RTLD_NEXT must tell them apart.
$(BUILD)/tests/libnext%.so: tests/process/rtld_next_lib.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -fPIC -shared $(SANITIZE) -DWHICH=$* -o $@ $< -ldl

# Linked ahead of the stand-in driver, exactly as a preload is searched.
$(BUILD)/tests/test_e2e: $(E2E_SRC) tests/process/testutil.h tests/process/vmm_testutil.h $(LIB) $(FAKE) \
                         $(BUILD)/tests/libnext1.so $(BUILD)/tests/libnext2.so
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $(E2E_SRC) -L$(BUILD) -L$(BUILD)/tests \
	    -Wl,--no-as-needed -lipccache -lnext1 -lnext2 -lcuda -Wl,--as-needed \
	    -Wl,-rpath,'$$ORIGIN/..' -Wl,-rpath,'$$ORIGIN' $(TEST_LIBS)

# Another interposer of the IPC calls, preloaded next to ipccache: it finds
# the next function by RTLD_NEXT, through the driver's handle (_handle) or
# the linked resolver (_getproc); _resolver hooks cuGetProcAddress instead
# of exporting the IPC names.
$(BUILD)/tests/libinterposer_%.so: tests/process/interposer_lib.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden \
	    -I$(CUDA_HOME)/include $(SANITIZE) $(if $(filter handle,$*),-DLOOKUP_HANDLE) \
	    $(if $(filter getproc,$*),-DLOOKUP_RESOLVER) \
	    $(if $(filter resolver,$*),-DHOOK_RESOLVER) -o $@ $< -ldl

# Widens a moment inside a C library call, for the fork and signal races.
$(BUILD)/tests/libwindow.so: tests/process/window_lib.c tests/process/exit_registration.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden $(SANITIZE) -o $@ $< -ldl

# Holds back the start of ipccache's helper thread, for the late-helper tests.
$(BUILD)/tests/libhelperhold.so: tests/process/helper_hold_lib.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden $(SANITIZE) -o $@ $< -ldl

# An allocator with its own lock and fork handler, for a fork while a lock of
# ipccache's is held across an allocation.
$(BUILD)/tests/liballoclock.so: tests/process/alloc_lock_lib.c tests/process/exit_registration.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden $(SANITIZE) -o $@ $< -ldl -lpthread

# Runs probe under LD_PRELOAD in fresh processes.
PROCESS_SRC = tests/process/process_run.c $(wildcard tests/process/test_process_*.c)
$(BUILD)/tests/test_process: $(PROCESS_SRC) tests/process/process_run.h $(BUILD)/tests/probe \
                             $(INTERPOSERS) $(BUILD)/tests/libwindow.so $(BUILD)/tests/liballoclock.so
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $(PROCESS_SRC) $(TEST_LIBS)

# RTLD_NEXT identity without Criterion (architectures tested under emulation).
$(BUILD)/tests/rtld_next_check: tests/process/rtld_next_check.c $(BUILD)/tests/libnext1.so $(BUILD)/tests/libnext2.so
	$(CC) -std=gnu11 -O2 -Wall -Wextra -o $@ $< -L$(BUILD)/tests -Wl,--no-as-needed -lnext1 -lnext2 \
	    -Wl,-rpath,'$$ORIGIN' -ldl

# Sanitizer runtimes call dlsym before they can serve pthread calls. Where
# the compiler has no ThreadSanitizer runtime the test skips itself.
$(BUILD)/tests/hello_tsan: tests/process/hello_sanitized.c
	@mkdir -p $(@D)
	-$(CC) -fsanitize=thread -o $@ $< 2>/dev/null

# The GPU's VMM error-case program, run against the stand-in (test_vmm.c
# compares its answers with the H200's).
$(BUILD)/tests/vmm_errors: tests/gpu/vmm_errors.cu tests/gpu/vmm_pair.h $(FAKE)
	$(CC) -x c -std=gnu11 -O1 -Wall -Wextra -DVMM_ERRORS_NO_COPY -I$(CUDA_HOME)/include $(SANITIZE) \
	    -o $@ $< -x none -L$(BUILD)/tests -lcuda -Wl,-rpath,'$$ORIGIN'

# Exporter and importer of the release tests: linked with the stand-in
# driver, run with the library preloaded; the test reads the stand-in's book.
$(BUILD)/tests/ghost_peer: tests/process/ghost_peer.c $(FAKE)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -L$(BUILD)/tests -lcuda -Wl,-rpath,'$$ORIGIN' -ldl

$(BUILD)/tests/test_ghost: tests/process/test_ghost.c shim/ledger/ledger_impl.h $(FAKE) \
                           $(BUILD)/tests/libhelperhold.so
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -L$(BUILD)/tests -lcuda -Wl,-rpath,'$$ORIGIN' $(TEST_LIBS)

# The hit path's race check, built by tests/process/test_tsan.sh with ThreadSanitizer
# (in BUILD/tsan); linked ahead of the stand-in driver like test_e2e.
$(BUILD)/tests/race_threads: tests/process/race_threads.c tests/standin/fake_cuda.h $(LIB) $(FAKE)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -L$(BUILD) -L$(BUILD)/tests \
	    -Wl,--no-as-needed -lipccache -lcuda -Wl,--as-needed \
	    -Wl,-rpath,'$$ORIGIN/..' -Wl,-rpath,'$$ORIGIN' -lpthread

# Reaches the driver as cudart does: dlopen + dlsym + cuGetProcAddress.
$(BUILD)/tests/probe: tests/process/probe.c $(FAKE)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -ldl -lpthread

# One run of the differential fuzzer; tests/fuzz/fuzz.sh runs it in pairs.
$(BUILD)/tests/fuzz: tests/fuzz/fuzz.c tests/fuzz/fuzz_vmm.c tests/fuzz/fuzz_ledger.c tests/fuzz/fuzz.h \
                     tests/standin/fake_cuda.h tests/standin/fake_vmm.h $(FAKE)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ tests/fuzz/fuzz.c tests/fuzz/fuzz_vmm.c tests/fuzz/fuzz_ledger.c -ldl -lpthread

# The stand-in soak's fleet (tests/soak/): one program, linked with the
# stand-in driver; the library is preloaded into the processes it starts.
SOAK_SRC = $(filter-out tests/soak/soak_plant.c,$(wildcard tests/soak/*.c))
$(BUILD)/tests/soak: $(SOAK_SRC) $(wildcard tests/soak/*.h) tests/standin/fake_cuda.h \
                     tests/standin/fake_vmm.h tests/gpu/vmm_pair.h shim/ledger/ledger_impl.h $(FAKE)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $(SOAK_SRC) -L$(BUILD)/tests -lcuda \
	    -Wl,-rpath,'$$ORIGIN' -lpthread

# Faults planted under the library for the soak's own tests.
$(BUILD)/tests/libsoakplant.so: tests/soak/soak_plant.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden \
	    -I$(CUDA_HOME)/include $(SANITIZE) -o $@ $< -ldl

# make test and make demo: one line per step; the build's command lines only
# with V=1 (its warnings and errors always).
QUIET_MAKE = $(MAKE) --no-print-directory $(if $(V),,--silent)
QUIET_NOTE = $(if $(V),, (V=1 shows the commands))

# Installs missing Debian packages first (as root), then builds and runs.
test:
	@bash tests/setup.sh
	@echo "test: building the library, the stand-in driver and the test programs$(QUIET_NOTE)"
	@$(QUIET_MAKE) test-programs
	@$(MAKE) --no-print-directory run-tests

run-tests: test-programs
	@bash tests/run.sh $(BUILD)

# Everything the suite runs, built (make mutants rebuilds a mutated copy so).
test-programs: $(LIB) $(CONFIG_TOOL) $(FAKE) $(TEST_BINS)

# The tools use the plain build/ipccache-config: built first.
test-sanitize:
	@bash tests/setup.sh
	@$(MAKE) --no-print-directory build/ipccache-config
	@$(MAKE) --no-print-directory BUILD=build/sanitize \
	    SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    run-tests

# Without and with the preload, seed by seed; a failure is minimised.
SEEDS ?= 1000
FIRST ?= 1
fuzz: $(LIB) $(FAKE) $(BUILD)/tests/fuzz
	@bash tests/fuzz/fuzz.sh $(BUILD) --seeds $(SEEDS) --first $(FIRST)

# Each mutation of tests/fuzz/mutants.txt in a copy of the tree: run-tests and a
# fuzz batch must fail. MUTANTS="3 7" runs only those.
mutants:
	@bash tests/fuzz/mutants.sh $(MUTANTS)

# The stand-in soak (tests/soak/soak.sh says what it runs and its settings):
# exits with its verdict.
soak:
	@bash tests/setup.sh soak
	@$(QUIET_MAKE) $(LIB) $(FAKE) $(BUILD)/tests/soak
	@bash tests/soak/soak.sh $(BUILD) $(abspath $(LIB))

# The aarch64 build, cross-compiled and run under qemu-user.
AARCH64_BUILD = build/aarch64
test-aarch64:
	@bash tests/setup.sh aarch64
	@$(MAKE) --no-print-directory CC=aarch64-linux-gnu-gcc BUILD=$(AARCH64_BUILD) \
	    $(AARCH64_BUILD)/libipccache.so $(AARCH64_BUILD)/tests/libcuda.so.1 \
	    $(AARCH64_BUILD)/tests/probe $(AARCH64_BUILD)/tests/rtld_next_check \
	    $(INTERPOSERS:$(BUILD)/%=$(AARCH64_BUILD)/%)
	@bash tests/test_aarch64.sh $(AARCH64_BUILD)

check-exports: $(LIB)
	@bash tests/tools/check_exports.sh $(LIB) $(MAP) shim/entry/hooks.c

# ---- real GPU ----------------------------------------------------------------

# A library already built is used as it is: no prerequisite check (a GPU
# host without network cannot install uthash, and needs it only to build).
BUILT_LIB = [ -f $(LIB) ] || $(MAKE) --no-print-directory $(LIB)

test-gpu:
	@$(BUILT_LIB)
	@IPCCACHE_LIB=$(abspath $(LIB)) bash tests/gpu/run.sh

bench:
	@$(BUILT_LIB)
	@bash tools/need_gpu.sh bench
	@IPCCACHE_LIB=$(abspath $(LIB)) bash tools/bench/bench.sh

# No GPU: the stand-in driver plays it (tools/bench/standin_report.sh says what runs), in a
# short labelled report that ends in one "bench-standin: result:" line.
$(BUILD)/tools/standin_rl: tools/bench/standin_rl.c tests/standin/fake_cuda.h tests/standin/fake_vmm.h tests/gpu/vmm_pair.h $(FAKE)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -L$(BUILD)/tests -lcuda -Wl,-rpath,'$$ORIGIN/../tests'

$(BUILD)/tools/standin_hits: tools/bench/standin_hits.c tests/standin/fake_cuda.h $(FAKE)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(TEST_INC) -o $@ $< -L$(BUILD)/tests -lcuda -Wl,-rpath,'$$ORIGIN/../tests' -lpthread

bench-standin: $(LIB) $(BUILD)/tools/standin_rl $(BUILD)/tools/standin_hits
	@bash tools/bench/standin_report.sh $(BUILD) $(abspath $(LIB))

# PEER_DIR holds a copy of PyTorch's test/test_multiprocessing.py and what
# peer-fetch put in PEER_DIR/sglang and PEER_DIR/rl (never committed).
PEER_DIR ?= .peer
peer:
	@$(BUILT_LIB)
	@IPCCACHE_LIB=$(abspath $(LIB)) bash tools/peer_suites.sh $(PEER_DIR)

peer-fetch:
	@bash tools/sglang_peer/fetch.sh $(PEER_DIR)
	@bash tools/rl_peer/fetch.sh $(PEER_DIR)

demo:
	@echo "demo: building the library, the stand-in driver and the probe$(QUIET_NOTE)"
	@$(QUIET_MAKE) $(LIB) $(FAKE) $(BUILD)/tests/probe
	@IPCCACHE_LIB=$(abspath $(LIB)) BUILD=$(BUILD) bash tools/demo.sh

# ---- packages -----------------------------------------------------------------

# pyproject.toml: hatchling runs this Makefile (BUILD=build/wheel-<arch>) and tags
# the wheel from the glibc versions the library really needs.
wheel: | prereqs
	python3 -m pip wheel --no-deps --wheel-dir $(BUILD)/dist .

# ---- install ------------------------------------------------------------------

# Files installed, relative to PREFIX; the folders install makes are listed
# in share/ipccache/folders so that uninstall removes only those. Its first
# line, "prefix N", counts the folders of PREFIX itself (and above it) that
# install made: uninstall removes those too when they are left empty.
INSTALL_DIRS = lib bin share share/man share/man/man7 share/ipccache
DEST         = $(DESTDIR)$(PREFIX)
FOLDERS      = $(DEST)/share/ipccache/folders

install: $(LIB) $(CONFIG_TOOL)
	@made=; for d in $(INSTALL_DIRS); do [ -d "$(DEST)/$$d" ] || made="$$made $$d"; done; \
	    new=0; p="$(DEST)"; while [ ! -d "$$p" ]; do new=$$((new + 1)); p=$$(dirname "$$p"); done; \
	    install -d $(addprefix $(DEST)/,$(INSTALL_DIRS)) && \
	    if [ -n "$$made" ] || [ ! -f "$(FOLDERS)" ]; then \
	        { echo "prefix $$new"; printf '%s\n' $$made; } > "$(FOLDERS)"; fi
	install -m 0755 $(LIB) $(DEST)/lib/libipccache.so
	install -m 0755 tools/ipccache-run tools/ipccache-stats $(CONFIG_TOOL) $(DEST)/bin/
	install -m 0644 tools/ipccache.7 $(DEST)/share/man/man7/ipccache.7

uninstall:
	rm -f $(DEST)/lib/libipccache.so $(DEST)/bin/ipccache-run $(DEST)/bin/ipccache-stats \
	    $(DEST)/bin/ipccache-config $(DEST)/share/man/man7/ipccache.7
	@if [ -f "$(FOLDERS)" ]; then \
	    new=$$(sed -n 's/^prefix \([0-9]*\)$$/\1/p' "$(FOLDERS)"); \
	    made=$$(grep -v '^prefix ' "$(FOLDERS)" | tac); rm -f "$(FOLDERS)"; \
	    for d in $$made; do rmdir "$(DEST)/$$d" 2>/dev/null || true; done; \
	    p="$(DEST)"; while [ "$${new:-0}" -gt 0 ] && rmdir "$$p" 2>/dev/null; do \
	        new=$$((new - 1)); p=$$(dirname "$$p"); done; \
	fi

clean:
	rm -rf build
