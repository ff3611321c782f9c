# farmem top-level build. `make help` lists the targets.
#
# Layout of what it builds (all under build/, which is disposable):
#   build/bin/farmem-memd           memory server
#   build/lib/libfarmem_preload.so  LD_PRELOAD shim that puts a program under the pager
#   build/tests/*, build/bench/*    C workloads used by the tests and benchmarks
#   build/unit/*                    C unit tests, built with ASan and UBSan
#   .venv/                          Python environment with the farmem CLI

SHELL      := /bin/bash
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:

B          := build
PYTHON     ?= python3
VENV       := .venv
CC         ?= gcc
CSTD       := -std=c11 -D_GNU_SOURCE
WARN       := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CFLAGS     ?= -O2 -g
CFLAGS     += $(CSTD) $(WARN) -fPIC -pthread -Imemd -Iuffd
SANFLAGS   := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
LDLIBS     := -lisal -lcrypto -lpthread

# Shared by every C component.
COMMON_SRCS := memd/fm_util.c memd/auth.c
# The memory server.
MEMD_SRCS   := memd/memd.c $(wildcard memd/server_*.c)
# The pager's client side of memd (stream and shm transports).
CLIENT_SRCS := $(wildcard memd/client_*.c)
# The pager library (everything in uffd/ but the preload shim's entry points).
PAGER_SRCS  := $(filter-out uffd/preload.c,$(wildcard uffd/*.c))
LIB_SRCS    := $(COMMON_SRCS) $(CLIENT_SRCS) $(PAGER_SRCS)

HDRS        := $(wildcard memd/*.h uffd/*.h)
TEST_PROGS  := $(patsubst tests/progs/%.c,$(B)/tests/%,$(wildcard tests/progs/*.c))
BENCH_PROGS := $(patsubst bench/progs/%.c,$(B)/bench/%,$(wildcard bench/progs/*.c))
UNIT_TESTS  := $(patsubst tests/unit/%.c,$(B)/unit/%,$(wildcard tests/unit/test_*.c))

.PHONY: all help deps venv c test test-c test-py demo bench clean distclean

help:
	@echo "make demo    install what is needed, build, run a demo under farmem (embedded memd, 25% local)"
	@echo "make test    install, build, run every test (C units under ASan/UBSan, then pytest)"
	@echo "make deps    install build and test dependencies (apt-get + pip), idempotent"
	@echo "make all     build the C components and the Python CLI"
	@echo "make bench   run the benchmarks and print their figures (see bench/RESULTS.md)"

all: c venv

c: $(B)/bin/farmem-memd $(B)/lib/libfarmem_preload.so $(TEST_PROGS) $(BENCH_PROGS) $(UNIT_TESTS)

deps:
	@bash tools/deps.sh

$(B)/.deps-ok: tools/deps.sh
	@bash tools/deps.sh
	@mkdir -p $(B) && touch $@

# --- C -------------------------------------------------------------------

$(B)/obj/%.o: %.c $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(B)/asan/%.o: %.c $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(SANFLAGS) -pthread -Imemd -Iuffd -c -o $@ $<

$(B)/bin/farmem-memd: $(patsubst %.c,$(B)/obj/%.o,$(MEMD_SRCS) $(COMMON_SRCS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(B)/lib/libfarmem_pager.a: $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRCS))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(B)/lib/libfarmem_preload.so: $(B)/obj/uffd/preload.o $(B)/lib/libfarmem_pager.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,--version-script=uffd/preload.map -o $@ $< \
		-Wl,--whole-archive $(B)/lib/libfarmem_pager.a -Wl,--no-whole-archive $(LDLIBS) -ldl

$(B)/tests/%: tests/progs/%.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -lpthread

$(B)/bench/%: bench/progs/%.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -lpthread

# Unit tests link every library source built with the sanitizers.
$(B)/unit/%: tests/unit/%.c $(patsubst %.c,$(B)/asan/%.o,$(LIB_SRCS) $(filter-out memd/memd.c,$(MEMD_SRCS)))
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(SANFLAGS) -pthread -Imemd -Iuffd -o $@ $^ $(LDLIBS)

# --- Python ----------------------------------------------------------------

venv: $(VENV)/.ok

$(VENV)/.ok: cli/pyproject.toml | $(B)/.deps-ok
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e 'cli[test]'
	@touch $@

# --- Tests, demo, benchmarks ------------------------------------------------

test-c: c
	@set -e; for t in $(UNIT_TESTS); do echo "== $$t"; $$t; done

test-py: all
	$(VENV)/bin/pytest -ra tests

test: test-c test-py

demo: all
	./farmem run --local 25% --summary-json $(B)/demo-summary.json -- $(B)/tests/pagetest --size 512M --rounds 2
	@echo "summary written to $(B)/demo-summary.json"

bench: all
	$(VENV)/bin/python bench/run_core.py

clean:
	rm -rf $(B)

distclean: clean
	rm -rf $(VENV)
