# `make` builds the engine; `make test` builds, installs the test environment on first use
# (.venv, from requirements-test.txt) and runs every test: C unit tests (also under
# ASan+UBSan) and the pytest suites, whose engine-protocol tests drive the ASan+UBSan engine too.
CC ?= gcc
PYTHON ?= python3
VERSION := $(shell $(PYTHON) -c 'import version; print(version.VERSION)')
CFLAGS ?= -O2
# -ffp-contract=off: the kernel sets give the same bits only if a * b + c is never fused behind
# their backs (GCC -std=c11 does not fuse; clang would)
CFLAGS += -std=c11 -ffp-contract=off -D_GNU_SOURCE -fopenmp -Wall -Wextra -DCOLI_VERSION='"$(VERSION)"'
LDLIBS = -lm
SANITIZE = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all
# Sources by folder (docs/architecture.md): c/<band>/*.c; c/tests/*.c are the C unit tests.
ENGINE_SRC := $(sort $(wildcard c/*/*.c))
ENGINE_SRC := $(filter-out c/tests/%,$(ENGINE_SRC))
LIB_SRC := $(filter-out c/engine/main.c,$(ENGINE_SRC))
CTEST_SRC := $(wildcard c/tests/*.c)
VENV := .venv
STAMP := $(VENV)/.installed
# One object per source and build kind, each with its dependency file (-MMD): a touched file
# rebuilds itself and what includes it, and `make` compiles in parallel over the cores.
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
DEPFLAGS = -MMD -MP
obj = $(patsubst c/%.c,build/obj/$(1)/%.o,$(2))
REL_OBJ := $(call obj,rel,$(ENGINE_SRC))
ASAN_OBJ := $(call obj,asan,$(ENGINE_SRC))
REL_LIB_OBJ := $(call obj,rel,$(LIB_SRC))
ASAN_LIB_OBJ := $(call obj,asan,$(LIB_SRC))
CTEST_REL_OBJ := $(call obj,rel,$(CTEST_SRC))
CTEST_ASAN_OBJ := $(call obj,asan,$(CTEST_SRC))

.PHONY: all build test test-deps ctest ctest-aarch64 pytest fuzz fuzz-build fuzz-test fuzz-merge clean venv format
all: build/colibri

# version.py: the version string is compiled in (COLI_VERSION).
build/obj/rel/%.o: c/%.c version.py
	@mkdir -p $(@D)
	@echo 'cc $<'
	@$(CC) $(CFLAGS) $(DEPFLAGS) -Ic -c -o $@ $<

build/obj/asan/%.o: c/%.c version.py
	@mkdir -p $(@D)
	@echo 'cc (asan) $<'
	@$(CC) $(CFLAGS) $(SANITIZE) $(DEPFLAGS) -Ic -c -o $@ $<

build/colibri: $(REL_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The engine itself under ASan+UBSan: the protocol tests drive it too (COLI_ENGINE, see tests/).
build/colibri_asan: $(ASAN_OBJ)
	$(CC) $(CFLAGS) $(SANITIZE) -o $@ $^ $(LDLIBS)

build/c_tests: $(REL_LIB_OBJ) $(CTEST_REL_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

build/c_tests_asan: $(ASAN_LIB_OBJ) $(CTEST_ASAN_OBJ)
	$(CC) $(CFLAGS) $(SANITIZE) -o $@ $^ $(LDLIBS)

-include $(REL_OBJ:.o=.d) $(ASAN_OBJ:.o=.d) $(CTEST_REL_OBJ:.o=.d) $(CTEST_ASAN_OBJ:.o=.d)

# `make build` builds the engine, as `make` does (the objects' rules make the folders).
build: build/colibri

$(STAMP): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --quiet --no-cache-dir -r requirements-test.txt
	$(VENV)/bin/python tools/test_env_report.py --after-install
	touch $@

venv: $(STAMP)

ctest: build/c_tests build/c_tests_asan
	./build/c_tests
	./build/c_tests_asan

# The kernel tests cross-compiled for AArch64 and run under user-mode QEMU: the NEON set (and
# the portable one) against the portable reference. Needs gcc-aarch64-linux-gnu and qemu-user.
AARCH64_CC ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64
AARCH64_SYSROOT ?= /usr/aarch64-linux-gnu
build/c_tests_aarch64: $(LIB_SRC) $(CTEST_SRC) $(wildcard c/*/*.h)
	@mkdir -p $(@D)
	@command -v $(AARCH64_CC) >/dev/null || { echo "$(AARCH64_CC) not found: install gcc-aarch64-linux-gnu (or set AARCH64_CC)"; exit 1; }
	$(AARCH64_CC) $(CFLAGS) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

ctest-aarch64: build/c_tests_aarch64
	@command -v $(QEMU_AARCH64) >/dev/null || { echo "$(QEMU_AARCH64) not found: install qemu-user (or set QEMU_AARCH64)"; exit 1; }
	$(QEMU_AARCH64) -L $(AARCH64_SYSROOT) ./build/c_tests_aarch64 kernels

pytest: build/colibri build/colibri_asan $(STAMP)
	$(VENV)/bin/python tools/test_env_report.py
	$(VENV)/bin/python -m pytest -q tests

# The system packages the tests drive (tmux, chromium, nginx, clang's fuzzer runtime, npm):
# installed when make runs as root with apt, else the command that installs them is named.
test-deps:
	@tools/test_deps.sh

# One suite after another (each builds what it needs in parallel): their output stays apart.
test: test-deps
	$(MAKE) ctest
	$(MAKE) pytest
	$(MAKE) fuzz-test

# Fuzzing (fuzz/README.md): libFuzzer harnesses over every parser of untrusted bytes, built with
# clang under ASan+UBSan; the Python parsers run under atheris in their own venv. `make fuzz`
# runs each target FUZZ_SECONDS on its kept corpus (fuzz/corpus/<target>/); `make test` runs
# each for FUZZ_TEST_SECONDS. A finding fails the run and names its reproducer.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 20
FUZZ_TEST_SECONDS ?= 5
FUZZ_FLAGS = -O1 -g -std=c11 -D_GNU_SOURCE -Wall -Wno-unknown-pragmas -fno-sanitize-recover=all -Ic \
	-DCOLI_VERSION='"$(VERSION)"' -DFUZZ_ASSETS='"$(CURDIR)/fuzz/assets/tiny"'
# Not parsers: kernels and the OpenMP ops (clang 14 rejects dispatch.c's CPU check, and has no
# libomp here), built by $(CC) without instrumentation. Everything else is instrumented, so a new
# engine file is fuzzed with its parsers' callers without editing this list.
FUZZ_PLAIN_SRC := $(filter-out c/kernels/membw.c c/kernels/gguf_quants.c,$(wildcard c/kernels/*.c)) c/experts/moe_exec.c
FUZZ_LIB_SRC := $(filter-out c/engine/main.c c/kernels/membw.c c/engine/engine.c $(FUZZ_PLAIN_SRC),$(ENGINE_SRC))
FUZZ_C_TARGETS := json safetensors container manifest tokenizer_load tokenizer_encode protocol kv grammar
FUZZ_PY_TARGETS := gguf chat_template
FUZZ_VENV := build/fuzz-venv

build/fuzz/libcoli.a: $(FUZZ_LIB_SRC) $(FUZZ_PLAIN_SRC) $(wildcard c/*/*.h)
	mkdir -p build/fuzz/obj
	cd build/fuzz/obj && $(FUZZ_CC) $(subst -Ic,-I$(CURDIR)/c,$(FUZZ_FLAGS)) -fsanitize=fuzzer-no-link,address,undefined \
		-c $(addprefix $(CURDIR)/,$(FUZZ_LIB_SRC))
	cd build/fuzz/obj && $(CC) -O1 -std=c11 -D_GNU_SOURCE -fopenmp -I$(CURDIR)/c -c $(addprefix $(CURDIR)/,$(FUZZ_PLAIN_SRC))
	rm -f $@ && ar rcs $@ $(addprefix build/fuzz/obj/,$(notdir $(FUZZ_LIB_SRC:.c=.o) $(FUZZ_PLAIN_SRC:.c=.o)))

build/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/*.h build/fuzz/libcoli.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< build/fuzz/libcoli.a -lgomp -lm

$(FUZZ_VENV)/.installed: fuzz/requirements.txt
	$(PYTHON) -m venv $(FUZZ_VENV)
	$(FUZZ_VENV)/bin/pip install --quiet --quiet --no-cache-dir -r fuzz/requirements.txt
	touch $@

fuzz-build: $(addprefix build/fuzz/fuzz_,$(FUZZ_C_TARGETS)) $(FUZZ_VENV)/.installed

fuzz: fuzz-build
	fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_C_TARGETS) $(FUZZ_PY_TARGETS)

fuzz-test: fuzz-build
	fuzz/run.sh $(FUZZ_TEST_SECONDS) $(FUZZ_C_TARGETS) $(FUZZ_PY_TARGETS)

# Adds to the kept corpus the inputs `make fuzz` found (build/fuzz/corpus/) that add coverage.
fuzz-merge: fuzz-build
	fuzz/run.sh merge $(FUZZ_C_TARGETS) $(FUZZ_PY_TARGETS)

# Formats the engine's C by .clang-format with the test venv's pinned clang-format (tests/test_c_format.py
# checks it); generated files are listed in .clang-format-ignore.
format: $(STAMP)
	git ls-files 'c/*.c' 'c/*.h' 'fuzz/*.c' 'fuzz/*.h' | grep -vxF -f .clang-format-ignore | xargs $(VENV)/bin/clang-format -i

clean:
	rm -rf build
