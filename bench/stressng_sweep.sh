#!/bin/bash
# Every stress-ng stressor with --verify, all local and then under farmem, one worker for 3 s each
# (`farmem run --local 4M --threshold 256K --fault FAULT`: a small budget and threshold, so that
# most of what a stressor maps is paged and pressed). A functional sweep, not a timing: it looks for
# a stressor that fails ("fail:" lines or a nonzero status) under farmem and not all local.
# Stressors that change the machine as root (CPUs offline, swap, sysfs writes, OOM, kernel logs,
# random system calls) are left out; the disk-filling ones are held to 64 MiB. Results go to
# OUTDIR/STRESSOR/{local,FAULT}.{log,rc} and one line each to OUTDIR/summary; a stressor already in
# the summary is skipped, so a stopped sweep goes on where it stopped.
#
#   bench/stressng_sweep.sh OUTDIR [signal|thread] [STRESSOR...]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
fault=${2:-signal}
shift $(($# < 2 ? $# : 2))
lim="--fallocate-bytes 64M --hdd-bytes 64M --iomix-bytes 64M --seek-size 64M --sync-file-bytes 64M --fiemap-bytes 64M"
skip=" cpu-online swap sysinval watchdog softlockup reboot klog oom-pipe smi rtc physpage tsc x86syscall bind-mount "
skip+=" ramfs mlockmany fanotify sysfs procfs dev kill apparmor idle-page ioport msr pci tun netlink-proc netlink-task "
skip+=" bad-ioctl fault mlock memhotplug cpu-sched spinmem mcontend numa "
mkdir -p "$out" "$out/tmp"
# Each stressor runs in a mount namespace of its own with a tmpfs of 4 GiB on /tmp, its working
# directory and --temp-path: stress-ng's resources stressor (and forkheavy, which shares its code)
# fills the disk for a moment, with or without farmem: thousands of O_TMPFILE files in /tmp,
# whatever --temp-path says, each fallocated (all of the disk's 92 GB within a second, all local,
# session 51; three times in session 50 every write on the machine failed meanwhile). Some leave
# files in their working directory (open's "stress-open-*"). As another user, the sweep's tmp.
confined() {
	if [ "$(id -u)" = 0 ]; then
		unshare -m sh -c 'mount -t tmpfs -o size=4g farmem-sweep /tmp && cd /tmp && exec "$@"' confined "$@"
	else
		(cd "$out/tmp" && "$@")
	fi
}
tmp=$([ "$(id -u)" = 0 ] && echo /tmp || echo "$out/tmp")
for s in ${*:-$(stress-ng --stressors)}; do
	case "$skip" in *" $s "*) continue ;; esac
	grep -q "^$s " "$out/summary" 2>/dev/null && continue
	d=$out/$s
	mkdir -p "$d"
	if [ ! -e "$d/local.rc" ]; then
		confined timeout -k 5 40 stress-ng --"$s" 1 --verify -t 3 --temp-path "$tmp" $lim >"$d/local.log" 2>&1
		echo $? >"$d/local.rc"
	fi
	confined timeout -k 5 90 "$here/farmem" run --local 4M --threshold 256K --fault "$fault" -- \
		stress-ng --"$s" 1 --verify -t 3 --temp-path "$tmp" $lim >"$d/$fault.log" 2>&1
	echo $? >"$d/$fault.rc"
	echo "$s local=$(cat "$d/local.rc") $fault=$(cat "$d/$fault.rc") local_fail=$(grep -c 'fail:' "$d/local.log")" \
		"${fault}_fail=$(grep -c 'fail:' "$d/$fault.log")" >>"$out/summary"
done
echo "Failing under farmem and not all local:"
awk -v f="$fault" '{ split($2, l, "="); split($3, m, "="); split($4, lf, "="); split($5, mf, "=");
	if ((m[2] != 0 && m[2] != 3 && m[2] != 4 && m[2] != l[2]) || (mf[2] > 0 && lf[2] == 0)) print }' "$out/summary"
