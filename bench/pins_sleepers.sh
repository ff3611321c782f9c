#!/bin/bash
# What held pins cost the evictor: build/bench/rewrite (random read-then-rewrite of 256 MiB at a
# 32 MiB budget, --fault signal) beside N threads asleep in read() on a pipe, each into a page
# paged by SIGBUS and so holding a pin for the whole run (--sleepers N). This build against
# another (BEFORE=its build/ tree, absolute, e.g. a worktree of an older commit after make),
# interleaved, REPEATS times (default 3). Prints the round phase's seconds and the summary's
# peak_pins and pins_refused per run.
#
#   BEFORE=/tmp/wprev/build bench/pins_sleepers.sh [SLEEPERS...]   (default: 0 1000 4000)
#   THREADS=8 for eight rewriting threads
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
counts=${*:-0 1000 4000}
tmp=$(mktemp -d)
for rep in $(seq "${REPEATS:-3}"); do
	for z in $counts; do
		for build in "$here/build" ${BEFORE:+"$BEFORE"}; do
			out=$(FARMEM_BUILD=$build timeout 300 "$here/farmem" run --local 32M --threshold 1M --fault signal \
				--summary-json "$tmp/s.json" -- "$here/build/bench/rewrite" --size 256M --rounds 400000 \
				--threads "${THREADS:-1}" --sleepers "$z" --json 2>&1)
			rounds=$(echo "$out" | sed -n 's/.*"rounds_s": \([0-9.]*\).*/\1/p')
			pins=$(/usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['peak_pins'], s['pins_refused'])" "$tmp/s.json" 2>/dev/null)
			echo "rep $rep sleepers $z build $build: rounds ${rounds:-FAILED} s, peak_pins/refused ${pins:-?}"
		done
	done
done
rm -rf "$tmp"
