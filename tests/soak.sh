#!/bin/bash
# A soak of other people's programs under farmem, each checking its own answers, round after round
# until SECONDS_TO_RUN have passed (default 1800): Neo4j (stock G1 and the farmem JDK), H2 with memd
# over a socket, Spark with handler threads, GcChurn with HotSpot's heap verifier after every GC.
# Not part of `make test` (it runs for half an hour); run it after `make all seeds` (and `make jdk`
# for the --gc farmem rows). One line a run in $OUT/results.txt; a failed run's output is kept as
# $OUT/fail-NAME-ROUND.log. Exits 1 if any run failed.
#   tests/soak.sh [SECONDS_TO_RUN] [OUT_DIR]
set -u
cd "$(dirname "$0")/.."
end=$(( $(date +%s) + ${1:-1800} ))
out=${2:-/tmp/farmem-soak}
mkdir -p "$out"
J=build/java
runs=(
  "neo4j|--local 25%|java -Xmx1g -jar $J/neo4j/neo4j-workload.jar --nodes 150000 --rounds 3000|neo4j: ok"
  "neo4j-fjdk|--local 25% --gc farmem|java -Xmx1g -jar $J/neo4j/neo4j-workload.jar --nodes 150000 --rounds 3000|neo4j: ok"
  "h2-stream|--local 25% --transport stream|java -Xmx512m -cp $J:$J/thirdparty/h2.jar H2Workload --rows 400000 --rounds 1000|h2: ok"
  "spark-thread|--local 25% --fault thread|java -Xmx1g -jar $J/spark/spark-workload.jar --nodes 300000 --iters 3|spark: ok"
  "gcchurn-verify|--local 25%|java -Xmx1g -XX:+UnlockDiagnosticVMOptions -XX:+VerifyAfterGC -cp $J GcChurn --live-mb 600 --steps 100000|gcchurn: ok"
  "gcchurn-fjdk|--local 50% --gc farmem|java -Xmx1g -XX:+UnlockDiagnosticVMOptions -XX:+VerifyAfterGC -cp $J GcChurn --live-mb 600 --steps 100000|gcchurn: ok"
)
failed=0 round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  for spec in "${runs[@]}"; do
    IFS='|' read -r name opts cmd ok <<< "$spec"
    [ "$(date +%s)" -lt "$end" ] || break
    t0=$(date +%s)
    # shellcheck disable=SC2086  # opts and cmd are word lists
    ./farmem run $opts -- $cmd > "$out/last-$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "$ok" "$out/last-$name.log"; then
      verdict=PASS
    else
      verdict=FAIL failed=$((failed + 1))
      cp "$out/last-$name.log" "$out/fail-$name-$round.log"
    fi
    echo "$(date +%T) $verdict $name round=$round rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$out/results.txt"
  done
done
echo "soak: $(grep -c PASS "$out/results.txt") passed, $failed failed this time ($out/results.txt)"
[ $failed -eq 0 ]
