#!/usr/bin/env bash
# Install what farmem needs to build and test, from Debian's packages. Idempotent:
# a second run installs nothing and takes well under a second.
set -euo pipefail

PKGS=(
	build-essential pkg-config git
	libisal-dev libssl-dev liburing-dev libaio-dev libnuma-dev numactl
	libjemalloc-dev libmimalloc2.0 libtcmalloc-minimal4
	clang llvm libclang-rt-14-dev libbpf-dev bpftool
	libibverbs-dev librdmacm-dev rdma-core
	iproute2 tmux util-linux procps
	python3 python3-venv python3-pip
	# the qemu lane (tests/vm/): Debian's kernel under TCG, kmod-swapva, soft-RoCE
	qemu-system-x86 busybox-static linux-headers-amd64 kmod cpio xz-utils
	ibverbs-utils rdmacm-utils perftest
	openjdk-17-jdk-headless maven
	# the compatibility matrix (tests/test_compat.py, bench/bench_compat.py): programs as users run them
	redis-server redis-tools memcached libmemcached-tools python3-numpy sqlite3 php-cli
	erlang-base sbcl nodejs swi-prolog-core yrmcds fio stress-ng openmpi-bin python3-mpi4py
	postgresql-15 postgresql-client-15
	# bench/bench_sweep.py: Debian programs under farmem, their peak RSS by GNU time
	time jq bzip2 zstd ruby lua5.4 tcl
	# bench/bench_fault.py's perf stat -a, bench/gc_profile.py's perf record
	linux-perf
	# a test run that hangs prints each thread's backtrace (tests/conftest.py threads_of_session)
	gdb
)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		SUDO=sudo
	else
		SUDO=
	fi
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
	$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
