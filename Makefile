# `make` builds the engine; `make test` builds, installs the test environment on first use
# (.venv, from requirements-test.txt) and runs every test: C unit tests (also under
# ASan+UBSan) and the pytest suites, whose engine-protocol tests drive the ASan+UBSan engine too.
CC ?= gcc
PYTHON ?= python3
VERSION := $(shell $(PYTHON) -c 'import version; print(version.VERSION)')
CFLAGS ?= -O2
CFLAGS += -std=c11 -D_GNU_SOURCE -fopenmp -Wall -Wextra -DCOLI_VERSION='"$(VERSION)"'
LDLIBS = -lm
SANITIZE = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all
ENGINE_SRC := $(wildcard c/*.c)
LIB_SRC := $(filter-out c/main.c,$(ENGINE_SRC))
HEADERS := $(wildcard c/*.h)
CTEST_SRC := $(wildcard c/tests/*.c)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: all test ctest pytest clean venv
all: build/colibri

build/colibri: $(ENGINE_SRC) $(HEADERS) | build
	$(CC) $(CFLAGS) -o $@ $(ENGINE_SRC) $(LDLIBS)

# The engine itself under ASan+UBSan: the protocol tests drive it too (COLI_ENGINE, see tests/).
build/colibri_asan: $(ENGINE_SRC) $(HEADERS) | build
	$(CC) $(CFLAGS) $(SANITIZE) -o $@ $(ENGINE_SRC) $(LDLIBS)

build/c_tests: $(LIB_SRC) $(CTEST_SRC) $(HEADERS) | build
	$(CC) $(CFLAGS) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

build/c_tests_asan: $(LIB_SRC) $(CTEST_SRC) $(HEADERS) | build
	$(CC) $(CFLAGS) $(SANITIZE) -Ic -o $@ $(LIB_SRC) $(CTEST_SRC) $(LDLIBS)

build:
	mkdir -p build

$(STAMP): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r requirements-test.txt
	touch $@

venv: $(STAMP)

ctest: build/c_tests build/c_tests_asan
	./build/c_tests
	./build/c_tests_asan

pytest: build/colibri build/colibri_asan $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

test: ctest pytest

clean:
	rm -rf build
