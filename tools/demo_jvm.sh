#!/usr/bin/env bash
# make demo's second half: Apache Spark (local mode, PageRank over a generated graph that it checks
# against a plain-Java computation, tests/java/spark) with a quarter of its heap local, beside the
# same JVM all local. The paged run must print the same digest.
set -euo pipefail
B=${1:-build}
cmd=(java -Xmx1g -jar "$B/java/spark/spark-workload.jar" --nodes 200000 --iters 5)
echo "== a JVM all local: ${cmd[*]}"
t0=$(date +%s.%N)
local_out=$("${cmd[@]}")
t1=$(date +%s.%N)
echo "$local_out"
echo "== the same JVM with a quarter of its heap local: ./farmem run --local 25% -- ${cmd[*]}"
paged_out=$(./farmem run --local 25% --summary-json "$B/demo-jvm-summary.json" -- "${cmd[@]}")
t2=$(date +%s.%N)
echo "$paged_out"
digest() { grep -o 'digest=[0-9a-f]*' <<<"$1"; }
if [ "$(digest "$local_out")" != "$(digest "$paged_out")" ]; then
	echo "demo: the paged run's digest differs from the all-local run's" >&2
	exit 1
fi
python3 - "$t0" "$t1" "$t2" "$B/demo-jvm-summary.json" <<'PY'
import json, sys
t0, t1, t2 = map(float, sys.argv[1:4])
s = json.load(open(sys.argv[4]))
print(f"demo: same digest; all local {t1 - t0:.1f} s, 25% local {t2 - t1:.1f} s ({(t2 - t1) / (t1 - t0):.2f}x), "
      f"peak resident {s['peak_resident_bytes'] >> 20} MiB of a {s['local_limit_bytes'] >> 20} MiB budget, "
      f"{s['remote_reads']} pages read back from memd; summary in {sys.argv[4]}")
PY
