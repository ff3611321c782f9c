# SPDX-License-Identifier: Apache-2.0
"""The seeds' workloads (issue 18), small: Apache Spark (PageRank in local[2] mode) and Neo4j
embedded, both real code from Maven Central (`make seeds`), each run under
`farmem run --local 25% -- java ...` with the system's JDK. A run passes when the workload's own
verdict is ok (it checked every answer against a plain-Java computation of the same data), its
digest is the one an unpaged run prints, and the summary shows that the heap really went to memd
and came back. Each workload's checker is also shown to catch a wrong answer.

About two and a half minutes on two idle CPUs (the JVMs start slowly: Spark and Neo4j load
thousands of classes).
"""

import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.memd, pytest.mark.pager, pytest.mark.jvm]

# The smoke sizes; bench/bench_seeds.py --size smoke runs the same.
SPARK = ["-Xmx512m", "-jar", "build/java/spark/spark-workload.jar", "--nodes", "100000", "--iters", "3"]
NEO4J = ["-Xmx256m", "-jar", "build/java/neo4j/neo4j-workload.jar", "--nodes", "10000", "--rounds", "100",
         "--batch", "5000"]
# What an unpaged run of those prints: a function of the flags alone (the generator is seeded and
# the digest comes from exact or plain-Java figures, not from Spark's summation order).
SPARK_DIGEST = "digest=9fc578859b6d4b10"
NEO4J_CHECKSUM = "checksum=5db1c82ac1d74ceb"


@pytest.fixture(scope="module")
def seeds_built(built, jvm_built):
    built("build/java/spark/spark-workload.jar")
    built("build/java/neo4j/neo4j-workload.jar")


def run(prefix, java_args, private_tmp):
    """prefix + java JAVA_ARGS from the checkout, with java.io.tmpdir (where Spark's shuffle files
    and Neo4j's store go) and TMPDIR in our own directory."""
    return subprocess.run([*prefix, "java", f"-Djava.io.tmpdir={private_tmp}", *java_args],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, TMPDIR=private_tmp))


def paged(farmem_cmd, tmp_path, private_tmp, java_args):
    summary = tmp_path / "summary.json"
    r = run([*farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--"], java_args, private_tmp)
    s = json.loads(summary.read_text()) if summary.exists() else {}
    return r, s


def leftovers(private_tmp):
    """What Neo4j (its store) or Spark (shuffle and block-manager directories) left behind."""
    return [n for n in os.listdir(private_tmp) if n.startswith(("farmem-neo4j-", "blockmgr-", "spark-"))]


def assert_paged(s):
    """The heap went to memd and came back, and both kinds of thread faulted."""
    assert s.get("evictions", 0) > 0 and s.get("remote_writes", 0) > 0, s
    assert s.get("remote_reads", 0) > 0, s
    assert s.get("gc_faults", 0) > 0 and s.get("app_faults", 0) > 0, s
    assert s.get("crc_errors", 0) == 0, s


@pytest.mark.parametrize("java_args,verdict,digest", [(SPARK, "spark: ok", SPARK_DIGEST),
                                                      (NEO4J, "neo4j: ok", NEO4J_CHECKSUM)],
                         ids=["spark", "neo4j"])
def test_at_25_percent(farmem_cmd, seeds_built, tmp_path, private_tmp, java_args, verdict, digest):
    r, s = paged(farmem_cmd, tmp_path, private_tmp, java_args)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert verdict in r.stdout and digest in r.stdout, r.stdout
    assert_paged(s)
    assert not leftovers(private_tmp)


@pytest.mark.parametrize("java_args,mismatch", [
    (["-Xmx512m", "-jar", "build/java/spark/spark-workload.jar", "--nodes", "5000", "--iters", "2"],
     "spark: MISMATCH rank of node 2500"),
    (["-Xmx256m", "-jar", "build/java/neo4j/neo4j-workload.jar", "--nodes", "2000", "--rounds", "10"],
     "neo4j: MISMATCH edges of group 0"),
], ids=["spark", "neo4j"])
def test_a_wrong_answer_fails(seeds_built, private_tmp, java_args, mismatch):
    """--self-test-corrupt alters one figure of the reference: the workload must say so and fail."""
    r = run([], [*java_args, "--self-test-corrupt"], private_tmp)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert mismatch in r.stdout, r.stdout
    assert " ok " not in r.stdout
    assert not leftovers(private_tmp), "a failed run must still clean up"
