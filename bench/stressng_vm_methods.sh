#!/bin/bash
# stress-ng's vm stressor, one method at a time: bogo ops a second all local, under farmem at 25%
# local, and under Linux swap (farmem's kswap mode) at the same 64 MiB plus kswap's usual 64 MiB for
# the rest. One worker of 256 MiB, --verify, T seconds each (default 5). stress-ng counts finished
# passes over its buffer: a worker killed by the cgroup's OOM killer counts nothing (-v says
# "OOM restarts"; bench/RESULTS.md, session 49).
#
#   bench/stressng_vm_methods.sh [METHOD...]     (T=SECONDS to change the time)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
methods=${*:-read64 write64 inc-nybble walk-1a walk-1d galpat-0 rowhammer mscan modulo-x move-inv prime-0 rand-set flip}
cd "$(mktemp -d)"
for m in $methods; do
	line="$m"
	for mode in local farmem kswap; do
		case $mode in
		local) pre=() ;;
		farmem) pre=("$here/farmem" run --local 25% --threshold 1M --) ;;
		kswap) pre=("$here/farmem" run --mode kswap --local 128M --threshold 1M --) ;;
		esac
		out=$(timeout 120 "${pre[@]}" stress-ng --vm 1 --vm-bytes 256M --vm-method "$m" --verify \
			-t "${T:-5}" --metrics-brief -v 2>&1)
		ops=$(echo "$out" | awk '/ vm  /{print $(NF-1)}' | tail -1)
		oom=$(echo "$out" | sed -n 's/.*OOM restarts: \([0-9]*\).*/\1/p' | head -1)
		fails=$(echo "$out" | grep -c "fail:")
		line="$line | $mode ${ops:-?} ops/s${oom:+, $oom OOM restarts}$([ "$fails" = 0 ] || echo ", $fails fail lines")"
	done
	echo "$line"
done
