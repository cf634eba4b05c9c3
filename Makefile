# ipccache - a cache of CUDA IPC mappings, loaded with LD_PRELOAD.
#
#   make                 build build/libipccache.so
#   make test            run the test suite (no GPU needed)
#   make test-sanitize   the same under ASan + UBSan
#   make fuzz            the differential fuzzer, SEEDS=1000 from FIRST=1
#   make mutants         one-spot bugs of shim/ (tests/mutants.txt): each must be caught
#   make test-gpu        prove it on a real GPU (says so when there is none)
#   make bench           benchmarks on a real GPU
#   make demo            show the main job (simulated without a GPU)
#   make install         PREFIX=/usr/local DESTDIR=

CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
BUILD     ?= build
CC        ?= cc
SANITIZE  ?=

CFLAGS_BASE = -std=gnu11 -O2 -g -Wall -Wextra -Wshadow -Wmissing-prototypes \
              -fPIC -fvisibility=hidden -I$(CUDA_HOME)/include -Ishim $(SANITIZE)
CFLAGS     ?=
ALL_CFLAGS  = $(CFLAGS_BASE) $(CFLAGS)

SHIM_SRC = shim/cache.c shim/config.c shim/evict.c shim/hooks.c shim/lifecycle.c \
           shim/lock.c shim/log.c shim/mappings.c shim/resolve.c shim/stats.c
# The dlsym trampoline is assembly, one file per architecture.
ARCH     := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine)))
TRAMPOLINE = $(BUILD)/shim/dlsym_$(ARCH).o
ifeq ($(wildcard shim/dlsym_$(ARCH).S),)
$(error ipccache supports x86_64 and aarch64; $(CC) targets $(ARCH))
endif
SHIM_OBJ = $(SHIM_SRC:%.c=$(BUILD)/%.o) $(TRAMPOLINE)
LIB      = $(BUILD)/libipccache.so

TEST_LIBS  = -lcriterion -ldl -lpthread
FAKE       = $(BUILD)/tests/libcuda.so.1
UNIT_SRC   = tests/test_cache.c tests/test_config.c
E2E_SRC    = $(filter-out $(UNIT_SRC) tests/test_process.c, $(wildcard tests/test_*.c))
TEST_BINS  = $(BUILD)/tests/test_unit $(BUILD)/tests/test_e2e $(BUILD)/tests/test_process \
             $(BUILD)/tests/probe $(BUILD)/tests/hello_tsan $(BUILD)/tests/fuzz

.PHONY: all test run-tests fuzz mutants test-sanitize test-aarch64 test-gpu bench demo install uninstall clean check-exports

all: $(LIB)

$(BUILD)/shim/%.o: shim/%.c shim/internal.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/shim/dlsym_%.o: shim/dlsym_%.S
	@mkdir -p $(@D)
	$(CC) $(SANITIZE) -fPIC -c $< -o $@

# Only libdl/libpthread: the library must load where no driver is installed.
$(LIB): $(SHIM_OBJ) shim/ipccache.map
	$(CC) -shared -o $@ $(SHIM_OBJ) $(SANITIZE) \
	    -Wl,--version-script=shim/ipccache.map -Wl,-Bsymbolic-functions -Wl,-z,now \
	    -ldl -lpthread

# ---- tests ------------------------------------------------------------------

$(FAKE): tests/fake_cuda.c tests/fake_cuda.h
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -I$(CUDA_HOME)/include $(SANITIZE) \
	    -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic-functions -o $@ $< -lpthread
	ln -sf libcuda.so.1 $(@D)/libcuda.so

# The table and the settings parser, tested alone: no CUDA, no preload.
$(BUILD)/tests/test_unit: $(UNIT_SRC) shim/cache.c shim/config.c shim/log.c shim/internal.h
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -fvisibility=default -o $@ $(UNIT_SRC) shim/cache.c shim/config.c \
	    shim/log.c $(TEST_LIBS)

# Two libraries defining one symbol: RTLD_NEXT must tell them apart.
$(BUILD)/tests/libnext%.so: tests/rtld_next_lib.c
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -O2 -fPIC -shared $(SANITIZE) -DWHICH=$* -o $@ $< -ldl

# Linked ahead of the stand-in driver, exactly as a preload is searched.
$(BUILD)/tests/test_e2e: $(E2E_SRC) tests/testutil.h $(LIB) $(FAKE) \
                         $(BUILD)/tests/libnext1.so $(BUILD)/tests/libnext2.so
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $(E2E_SRC) -L$(BUILD) -L$(BUILD)/tests \
	    -Wl,--no-as-needed -lipccache -lnext1 -lnext2 -lcuda -Wl,--as-needed \
	    -Wl,-rpath,'$$ORIGIN/..' -Wl,-rpath,'$$ORIGIN' $(TEST_LIBS)

# Runs probe under LD_PRELOAD in fresh processes.
$(BUILD)/tests/test_process: tests/test_process.c $(BUILD)/tests/probe
	$(CC) $(ALL_CFLAGS) -Itests -o $@ tests/test_process.c $(TEST_LIBS)

# RTLD_NEXT identity without Criterion (architectures tested under emulation).
$(BUILD)/tests/rtld_next_check: tests/rtld_next_check.c $(BUILD)/tests/libnext1.so $(BUILD)/tests/libnext2.so
	$(CC) -std=gnu11 -O2 -Wall -Wextra -o $@ $< -L$(BUILD)/tests -Wl,--no-as-needed -lnext1 -lnext2 \
	    -Wl,-rpath,'$$ORIGIN' -ldl

# Sanitizer runtimes call dlsym before they can serve pthread calls. Where
# the compiler has no ThreadSanitizer runtime the test skips itself.
$(BUILD)/tests/hello_tsan: tests/hello_sanitized.c
	@mkdir -p $(@D)
	-$(CC) -fsanitize=thread -o $@ $< 2>/dev/null

# Reaches the driver as cudart does: dlopen + dlsym + cuGetProcAddress.
$(BUILD)/tests/probe: tests/probe.c $(FAKE)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< -ldl -lpthread

# One run of the differential fuzzer; tests/fuzz.sh runs it in pairs.
$(BUILD)/tests/fuzz: tests/fuzz.c tests/fake_cuda.h $(FAKE)
	$(CC) $(ALL_CFLAGS) -Itests -o $@ $< -ldl -lpthread

# Installs missing Debian packages first (as root), then builds and runs.
test:
	@bash tests/setup.sh
	@$(MAKE) --no-print-directory run-tests

run-tests: $(LIB) $(FAKE) $(TEST_BINS)
	@bash tests/run.sh $(BUILD)

test-sanitize:
	@bash tests/setup.sh
	@$(MAKE) --no-print-directory BUILD=build/sanitize \
	    SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    run-tests

# Without and with the preload, seed by seed; a failure is minimised.
SEEDS ?= 1000
FIRST ?= 1
fuzz: $(LIB) $(FAKE) $(BUILD)/tests/fuzz
	@bash tests/fuzz.sh $(BUILD) --seeds $(SEEDS) --first $(FIRST)

# Each mutation of tests/mutants.txt in a copy of the tree: run-tests and a
# fuzz batch must fail. MUTANTS="3 7" runs only those.
mutants:
	@bash tests/mutants.sh $(MUTANTS)

# The aarch64 build, cross-compiled and run under qemu-user.
AARCH64_BUILD = build/aarch64
test-aarch64:
	@bash tests/setup.sh aarch64
	@$(MAKE) --no-print-directory CC=aarch64-linux-gnu-gcc BUILD=$(AARCH64_BUILD) \
	    $(AARCH64_BUILD)/libipccache.so $(AARCH64_BUILD)/tests/libcuda.so.1 \
	    $(AARCH64_BUILD)/tests/probe $(AARCH64_BUILD)/tests/rtld_next_check
	@bash tests/test_aarch64.sh $(AARCH64_BUILD)

check-exports: $(LIB)
	@bash tests/check_exports.sh $(LIB) shim/ipccache.map

# ---- real GPU ----------------------------------------------------------------

test-gpu: | $(LIB)
	@IPCCACHE_LIB=$(abspath $(LIB)) bash tests/gpu/run.sh

bench: | $(LIB)
	@IPCCACHE_LIB=$(abspath $(LIB)) bash tools/bench.sh

demo: $(LIB) $(FAKE) $(BUILD)/tests/probe
	@IPCCACHE_LIB=$(abspath $(LIB)) BUILD=$(BUILD) bash tools/demo.sh

# ---- install ------------------------------------------------------------------

install: $(LIB)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 0755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libipccache.so
	install -m 0755 tools/ipccache-run tools/ipccache-stats $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 tools/ipccache.7 $(DESTDIR)$(PREFIX)/share/man/man7/ipccache.7

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/lib/libipccache.so $(DESTDIR)$(PREFIX)/bin/ipccache-run \
	    $(DESTDIR)$(PREFIX)/bin/ipccache-stats $(DESTDIR)$(PREFIX)/share/man/man7/ipccache.7

clean:
	rm -rf build
