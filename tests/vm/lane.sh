#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The qemu lane (`make vm-test`, docs/vm-lane.md): boot Debian 12's own kernel
# (linux-image-amd64, unpacked, not installed) in qemu-system-x86_64 under TCG
# (KVM does not boot stock kernels on these machines) with a small busybox
# initramfs; the guest sees the host's /usr and /etc read-only over 9p and the
# lane directory read-write at /mnt/work. Builds kmod-swapva against
# linux-headers-amd64, runs tests/vm/guest.sh in the guest, prints one
# `PASS: name` / `FAIL: name` line per test and `N passed, N failed`, and
# exits non-zero when a test failed or the guest never reported.
#
# Environment: VM_DIR (cache, default build/vm), QEMU_TIMEOUT (s, default 900: a shared, loaded machine runs the whole lane in about 10 min),
# VM_MEM (2G), VM_SMP (2), VM_VERBOSE=1 (show the whole guest console),
# VM_TESTS (comma-separated subset of guest test groups: swapva rdma bench swapvagc),
# FARMEM_JDK (the farmem JDK home for swapvagc; default `hotspot/build.sh --home`).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
L=${VM_DIR:-$REPO/build/vm}
mkdir -p "$L"
L=$(cd "$L" && pwd)
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
t0=$SECONDS
log() { echo "vm-lane: $*" >&2; }

# --- packages (idempotent: dpkg-query first, apt-get only for what is missing) ----
PKGS=(qemu-system-x86 busybox-static linux-headers-amd64 kmod cpio xz-utils gzip
	rdma-core ibverbs-utils rdmacm-utils perftest iproute2 gcc make)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
	$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
	$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the guest kernel: the linux-image matching linux-headers-amd64 -----------------
KVER=$(dpkg-query -W -f='${Depends}' linux-headers-amd64 | sed -E 's/^linux-headers-([^ ,]+).*/\1/')
[ -d /usr/lib/modules/$KVER/build ] || { log "no headers for $KVER"; exit 2; }
if [ ! -e "$L/kroot/boot/vmlinuz-$KVER" ]; then
	log "unpacking linux-image-$KVER"
	rm -rf "$L/kroot" "$L/vmlinux"
	(cd "$L" && apt-get download -q "linux-image-$KVER" >/dev/null 2>&1)
	dpkg-deb -x "$L"/linux-image-"${KVER}"_*.deb "$L/kroot"
	rm -f "$L"/linux-image-"${KVER}"_*.deb
	depmod -b "$L/kroot" "$KVER"
fi
if [ ! -s "$L/vmlinux" ]; then  # boot the ELF through PVH: skips xz in the guest
	off=$(grep -obUaP '\xfd7zXZ\x00' "$L/kroot/boot/vmlinuz-$KVER" | head -1 | cut -d: -f1)
	tail -c +$((off + 1)) "$L/kroot/boot/vmlinuz-$KVER" | xz -dc --single-stream >"$L/vmlinux" 2>/dev/null || true
fi

# --- what the guest runs: the module and the test programs -------------------------
O=$L/out
mkdir -p "$O/kmod"
cp "$REPO"/kmod-swapva/{swapva.c,swapva.h,Kbuild} "$O/kmod/"
make -s -C /usr/lib/modules/$KVER/build M="$O/kmod" modules >"$O/kmod/build.log" 2>&1 ||
	{ cat "$O/kmod/build.log"; log "module build failed"; }
CF="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -pthread -I$REPO/uffd"
gcc $CF -o "$O/test_swapva" "$REPO/tests/unit/test_swapva.c" "$REPO/kmod-swapva/libswapva.c"
gcc $CF -o "$O/swapva_bench" "$REPO/bench/progs/swapva_bench.c" "$REPO/kmod-swapva/libswapva.c"
for f in "$REPO"/tests/vm/progs/*.c; do
	[ -e "$f" ] && gcc $CF -o "$O/$(basename "$f" .c)" "$f"
done
cp "$REPO/tests/vm/guest.sh" "$REPO/bench/bench_swapva.py" "$O/"
# the rdma transport: memd, the preload shim, pagetest and faultlat from `make c`, and the lane's peer
for f in bin/farmem-memd lib/libfarmem_preload.so tests/pagetest bench/faultlat; do
	if [ -e "$REPO/build/$f" ]; then cp "$REPO/build/$f" "$O/"; else log "build/$f missing: run make c"; fi
done
gcc $CF -I"$REPO/memd/common" -I"$REPO/memd/client" -I"$REPO/memd/client/include" -o "$O/rdma_peer" \
	"$REPO/tests/vm/rdma_peer.c" "$REPO"/memd/client/*.c "$REPO"/memd/common/*.c \
	-lisal -lcrypto -lnuma -libverbs -lrdmacm || log "rdma_peer build failed"

# the farmem JDK (docs/patched-jdk.md) for the swapvagc group: shared read-only as the 9p tag
# `jdk` (~/.cache is not under the guest's /usr); the agent provides farmem_swapva_move, which
# goes through libswapva (the module) when no pager runs. Without a built JDK the guest says SKIP.
JDK=${FARMEM_JDK:-$(bash "$REPO/hotspot/build.sh" --home 2>/dev/null || true)}
JDK_SHARE=()
rm -f "$O/jdk.home"
if [ -n "$JDK" ] && [ -x "$JDK/bin/java" ] && [ -e "$JDK/lib/server/libjvm.so" ]; then
	JDK=$(cd "$JDK" && pwd)
	echo "$JDK" >"$O/jdk.home"
	JDK_SHARE=(-virtfs "local,path=$JDK,mount_tag=jdk,readonly=on,security_model=none,multidevs=remap")
	mkdir -p "$O/java" "$O/lib"
	for f in lib/libfarmem_agent.so java/LargeArrays.class; do
		if [ -e "$REPO/build/$f" ]; then cp "$REPO/build/$f" "$O/$f"; else log "build/$f missing: run make c"; fi
	done
	cp "$REPO/bench/bench_swapva_gc.py" "$O/"
	log "farmem JDK $JDK shared as 9p tag jdk"
else
	log "no farmem JDK (make jdk, or FARMEM_JDK=<home>): the swapvagc tests will be skipped"
fi

# --- initramfs: static busybox + the virtio/9p modules, rebuilt when init changes ----
if [ ! -s "$L/initrd.gz" ] || [ "$REPO/tests/vm/init" -nt "$L/initrd.gz" ]; then
	T=$(mktemp -d)
	mkdir -p "$T"/{proc,sys,dev,usr,etc,tmp,run,root,var,mnt/work,m}
	for d in bin sbin lib lib64; do ln -s usr/$d "$T/$d"; done  # merged /usr
	cp /bin/busybox "$T/busybox"
	for m in virtio_pci 9pnet_virtio 9p; do
		modprobe -d "$L/kroot" -S "$KVER" --show-depends $m | awk '$1=="insmod"{print $2}'
	done | awk '!s[$0]++' | while read -r k; do
		cp "$k" "$T/m/"
		basename "$k" .ko >>"$T/m/order"
	done
	install -m 755 "$REPO/tests/vm/init" "$T/init"
	(cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) >"$L/initrd.gz"
	rm -rf "$T"
fi
log "prepared in $((SECONDS - t0)) s; booting $KVER under TCG"

# --- boot ----------------------------------------------------------------------------
K=$L/vmlinux; [ -s "$K" ] || K=$L/kroot/boot/vmlinuz-$KVER
rm -f "$L/guest.rc"
V="security_model=none,multidevs=remap"
set +e
timeout "${QEMU_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg -cpu max -m "${VM_MEM:-2G}" -smp "${VM_SMP:-2}" \
	-nodefaults -no-reboot -display none -serial stdio -nic none \
	-kernel "$K" -initrd "$L/initrd.gz" \
	-append "console=ttyS0 quiet panic=-1 mitigations=off run=/mnt/work/out/guest.sh vmtests=${VM_TESTS:-all}" \
	-virtfs local,path=/usr,mount_tag=usr,readonly=on,$V \
	-virtfs local,path=/etc,mount_tag=etc,readonly=on,$V \
	-virtfs local,path="$L",mount_tag=work,$V "${JDK_SHARE[@]}" </dev/null >"$L/guest.log" 2>&1
qrc=$?
set -e
if [ "${VM_VERBOSE:-0}" = 1 ]; then
	cat "$L/guest.log"
else  # the test lines, the tables and anything that went wrong
	grep -aE '^(PASS|FAIL|SKIP|INFO|\||\*\*|backends available|test_swapva|GUEST_|[0-9]+ passed)|FAIL \[|Oops|BUG|WARNING|Call Trace' "$L/guest.log" |
		tr -d '\r' || true
fi
rc=$(cat "$L/guest.rc" 2>/dev/null || echo 99)
if [ "$rc" = 99 ]; then
	echo "FAIL: guest-boot (qemu exit $qrc, no result; see $L/guest.log)"
	tail -20 "$L/guest.log" | tr -d '\r'
	echo "0 passed, 1 failed"
fi
log "done in $((SECONDS - t0)) s, guest status $rc"
exit "$rc"
