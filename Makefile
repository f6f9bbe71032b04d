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
ENGINE_SRC := $(wildcard c/*.c)
LIB_SRC := $(filter-out c/main.c,$(ENGINE_SRC))
HEADERS := $(wildcard c/*.h)
CTEST_SRC := $(wildcard c/tests/*.c)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: all test ctest ctest-aarch64 pytest fuzz fuzz-build fuzz-test fuzz-merge clean venv
all: build/colibri

# The recipes echo c/*.c for the sixty-odd sources, so that a CI log shows more than the builds.
build/colibri: $(ENGINE_SRC) $(HEADERS) | build
	@echo '$(CC) $(CFLAGS) -o $@ c/*.c $(LDLIBS)'
	@$(CC) $(CFLAGS) -o $@ $(ENGINE_SRC) $(LDLIBS)

# The engine itself under ASan+UBSan: the protocol tests drive it too (COLI_ENGINE, see tests/).
build/colibri_asan: $(ENGINE_SRC) $(HEADERS) | build
	@echo '$(CC) $(CFLAGS) $(SANITIZE) -o $@ c/*.c $(LDLIBS)'
	@$(CC) $(CFLAGS) $(SANITIZE) -o $@ $(ENGINE_SRC) $(LDLIBS)

build/c_tests: $(LIB_SRC) $(CTEST_SRC) $(HEADERS) | build
	@echo '$(CC) $(CFLAGS) -Ic -o $@ c/*.c (less main.c) c/tests/*.c $(LDLIBS)'
	@$(CC) $(CFLAGS) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

build/c_tests_asan: $(LIB_SRC) $(CTEST_SRC) $(HEADERS) | build
	@echo '$(CC) $(CFLAGS) $(SANITIZE) -Ic -o $@ c/*.c (less main.c) c/tests/*.c $(LDLIBS)'
	@$(CC) $(CFLAGS) $(SANITIZE) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

build:
	mkdir -p build

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
build/c_tests_aarch64: $(LIB_SRC) $(CTEST_SRC) $(HEADERS) | build
	@command -v $(AARCH64_CC) >/dev/null || { echo "$(AARCH64_CC) not found: install gcc-aarch64-linux-gnu (or set AARCH64_CC)"; exit 1; }
	$(AARCH64_CC) $(CFLAGS) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

ctest-aarch64: build/c_tests_aarch64
	@command -v $(QEMU_AARCH64) >/dev/null || { echo "$(QEMU_AARCH64) not found: install qemu-user (or set QEMU_AARCH64)"; exit 1; }
	$(QEMU_AARCH64) -L $(AARCH64_SYSROOT) ./build/c_tests_aarch64 kernels

pytest: build/colibri build/colibri_asan $(STAMP)
	$(VENV)/bin/python tools/test_env_report.py
	$(VENV)/bin/python -m pytest -q tests

test: ctest pytest fuzz-test

# Fuzzing (fuzz/README.md): libFuzzer harnesses over every parser of untrusted bytes, built with
# clang under ASan+UBSan; the Python parsers run under atheris in their own venv. `make fuzz`
# runs each target FUZZ_SECONDS on its kept corpus (fuzz/corpus/<target>/); `make test` runs
# each for FUZZ_TEST_SECONDS. A finding fails the run and names its reproducer.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 20
FUZZ_TEST_SECONDS ?= 5
FUZZ_FLAGS = -O1 -g -std=c11 -D_GNU_SOURCE -Wall -Wno-unknown-pragmas -fno-sanitize-recover=all -Ic \
	-DCOLI_VERSION='"$(VERSION)"' -DFUZZ_ASSETS='"$(CURDIR)/fuzz/assets/tiny"'
# Not parsers: kernels and the OpenMP ops (clang 14 rejects quant.c's CPU check, and has no
# libomp here), built by $(CC) without instrumentation. Everything else is instrumented, so a new
# engine file is fuzzed with its parsers' callers without editing this list.
FUZZ_PLAIN_SRC := c/quant.c c/mla_absorb.c c/dsa_score.c c/kernels_avx2.c c/kernels_avx512.c c/kernels_vnni.c c/kernels_vnni_small.c c/kernels_amx.c c/kernels_neon.c c/kernels_mxfp4.c c/kv_kernels.c c/kv_attend_x86.c c/kv_attend_neon.c c/ops.c c/moe_exec.c
FUZZ_LIB_SRC := $(filter-out c/main.c c/membw.c c/engine.c $(FUZZ_PLAIN_SRC),$(ENGINE_SRC))
FUZZ_C_TARGETS := json safetensors container manifest tokenizer_load tokenizer_encode protocol kv grammar
FUZZ_PY_TARGETS := gguf chat_template
FUZZ_VENV := build/fuzz-venv

build/fuzz/libcoli.a: $(FUZZ_LIB_SRC) $(FUZZ_PLAIN_SRC) $(HEADERS)
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

clean:
	rm -rf build
