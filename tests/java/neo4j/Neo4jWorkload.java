// SPDX-License-Identifier: Apache-2.0
/*
 * One of the seeds' workloads (issue 18): Neo4j embedded (org.neo4j:neo4j, Community, from Maven
 * Central: tests/java/neo4j/pom.xml) over a generated graph whose every answer the program knows.
 *
 * Loads --nodes (:P {id, g, w}) nodes and their out-edges [:K] (tests/java/seedgraph/SeedGraph.java:
 * out-degree 1..2*degree-1, targets a mix of hubs, neighbours and anywhere, a pure function of id
 * and --seed, the graph Spark's PageRank runs on) through the embedded API in transactions of
 * --batch nodes (Neo4j keeps a transaction's state on the Java heap), with an index on :P(id).
 * Then --rounds rounds of Cypher, each on a random node v:
 *   - out-neighbours of v: count and sum of ids,
 *   - in-neighbours of v: count and sum of ids,
 *   - the two-hop paths from v: count and sum of end ids,
 *   - every fourth round an update of w on a random node (committed),
 * and every --scan-every rounds, and at the end, whole-graph aggregations that Cypher runs in hash
 * tables on the Java heap: edges grouped by the source's group g (count, sum of target ids), and
 * the in-degree histogram (grouped by each target node, then by its in-degree), and the sum of w
 * per group. Every answer is compared with what the program computes from the generator in plain
 * Java; the first wrong one prints "neo4j: MISMATCH ..." and exits 1. Success prints
 * "neo4j: ok ..." with a checksum of the answers and exits 0.
 *
 * The store lives in a private directory under java.io.tmpdir, deleted at the end. Neo4j's page
 * cache (the store's records) is native memory, not heap: --pagecache-mb (default 64) sizes it.
 * Nothing is sent anywhere: no Bolt or HTTP connector, and the usage-data collector is both
 * switched off here and left out of the build (pom.xml).
 *
 *   java -Xmx1g -jar build/java/neo4j/neo4j-workload.jar [--nodes 200000] [--degree 8]
 *        [--rounds 2000] [--scan-every 1000] [--batch 20000] [--pagecache-mb 64] [--seed 1]
 *        [--self-test-corrupt]
 *
 * --self-test-corrupt alters one expected count of the whole-graph check: the run must then fail.
 */
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.connectors.HttpConnector;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.graphdb.Label;
import org.neo4j.graphdb.Node;
import org.neo4j.graphdb.RelationshipType;
import org.neo4j.graphdb.Result;
import org.neo4j.graphdb.Transaction;
import org.neo4j.io.ByteUnit;

public final class Neo4jWorkload {
    static final int GROUPS = 64;
    static final Label P = Label.label("P");
    static final RelationshipType K = RelationshipType.withName("K");

    static long w0(int v) { return SeedGraph.mix(v ^ 0x5DEECE66DL) & 0xFFFFF; }

    /** A wrong answer: thrown, so that the database shuts down and its store is deleted first. */
    static final class Mismatch extends RuntimeException {
        Mismatch(String what) { super(what); }
    }

    static void fail(String what) {
        throw new Mismatch(what);
    }

    static long checksum;

    /** Runs a query that returns one row of longs and checks it. */
    static void expectRow(GraphDatabaseService db, String q, Map<String, Object> params, String what, long... want) {
        try (Transaction tx = db.beginTx(); Result r = tx.execute(q, params)) {
            if (!r.hasNext()) fail(what + ": no row");
            Map<String, Object> row = r.next();
            List<String> cols = r.columns();
            for (int i = 0; i < want.length; i++) {
                Object o = row.get(cols.get(i));
                long got = o == null ? 0 : ((Number) o).longValue();
                if (got != want[i]) fail(what + ": " + cols.get(i) + " = " + got + ", expected " + want[i]);
                checksum = checksum * 31 + got;
            }
            if (r.hasNext()) fail(what + ": more than one row");
            tx.commit();
        }
    }

    public static void main(String[] args) throws Exception {
        try {
            run(args);
        } catch (Mismatch m) {
            System.out.println("neo4j: MISMATCH " + m.getMessage());
            System.exit(1);
        }
    }

    @SuppressWarnings("removal") // getNodeById: internal ids are longs, element ids strings to parse
    static void run(String[] args) throws Exception {
        int nodes = 200_000, degree = 8;
        long seed = 1;
        int rounds = 2000, scanEvery = 1000, batch = 20_000, pagecacheMb = 64;
        boolean corrupt = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--nodes": nodes = Integer.parseInt(args[++i]); break;
                case "--degree": degree = Integer.parseInt(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                case "--scan-every": scanEvery = Integer.parseInt(args[++i]); break;
                case "--batch": batch = Integer.parseInt(args[++i]); break;
                case "--pagecache-mb": pagecacheMb = Integer.parseInt(args[++i]); break;
                case "--seed": seed = Long.parseLong(args[++i]); break;
                case "--self-test-corrupt": corrupt = true; break;
                default:
                    System.err.println("usage: Neo4jWorkload [--nodes N] [--degree D] [--rounds R] [--scan-every S] "
                                       + "[--batch B] [--pagecache-mb M] [--seed S] [--self-test-corrupt]");
                    System.exit(2);
            }
        }
        if (nodes < 1000 || degree < 1 || rounds < 0 || scanEvery < 1 || batch < 1 || pagecacheMb < 8) {
            System.err.println("neo4j: --nodes >= 1000, --degree, --scan-every, --batch >= 1, --pagecache-mb >= 8");
            System.exit(2);
        }
        long t0 = System.nanoTime();

        // What the answers must be, from the generator alone.
        SeedGraph g = new SeedGraph(nodes, degree, seed);
        int n = nodes;
        int[] off = new int[n + 1];
        for (int v = 0; v < n; v++) off[v + 1] = off[v] + g.outDegree(v);
        int[] dst = new int[off[n]];
        int[] indeg = new int[n];
        long[] outSum = new long[n], inSum = new long[n];
        long[] groupEdges = new long[GROUPS], groupTargetSum = new long[GROUPS], groupW = new long[GROUPS];
        long[] w = new long[n];
        for (int v = 0; v < n; v++) {
            w[v] = w0(v);
            groupW[v % GROUPS] += w[v];
            for (int j = 0, e = off[v]; e < off[v + 1]; j++, e++) {
                int t = g.target(v, j);
                dst[e] = t;
                indeg[t]++;
                outSum[v] += t;
                inSum[t] += v;
                groupEdges[v % GROUPS]++;
                groupTargetSum[v % GROUPS] += t;
            }
        }
        if (corrupt) groupEdges[0]++; // the whole-graph check must catch one wrong count
        Map<Long, Long> histogram = new HashMap<>(); // in-degree -> nodes with it (those with in-links)
        for (int v = 0; v < n; v++) if (indeg[v] > 0) histogram.merge((long) indeg[v], 1L, Long::sum);

        Path dir = Files.createTempDirectory("farmem-neo4j-");
        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(dir)
                .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.mebiBytes(pagecacheMb))
                .setConfig(GraphDatabaseSettings.udc_enabled, false)
                .setConfig(BoltConnector.enabled, false)
                .setConfig(HttpConnector.enabled, false)
                .setConfig(GraphDatabaseSettings.preallocate_logical_logs, false)
                .setConfig(GraphDatabaseSettings.keep_logical_logs, "false")
                .build();
        long edges = off[n];
        long queries = 0, tLoad, tQuery;
        try {
            GraphDatabaseService db = dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME);
            try (Transaction tx = db.beginTx()) {
                tx.schema().indexFor(P).on("id").withName("p_id").create();
                tx.commit();
            }
            try (Transaction tx = db.beginTx()) {
                tx.schema().awaitIndexesOnline(10, TimeUnit.MINUTES);
                tx.commit();
            }
            long[] eid = new long[n];
            for (int lo = 0; lo < n; lo += batch) {
                try (Transaction tx = db.beginTx()) {
                    for (int v = lo; v < Math.min(n, lo + batch); v++) {
                        Node x = tx.createNode(P);
                        x.setProperty("id", (long) v);
                        x.setProperty("g", (long) (v % GROUPS));
                        x.setProperty("w", w[v]);
                        eid[v] = x.getId();
                    }
                    tx.commit();
                }
            }
            for (int lo = 0; lo < n; lo += batch) {
                try (Transaction tx = db.beginTx()) {
                    for (int v = lo; v < Math.min(n, lo + batch); v++) {
                        Node a = tx.getNodeById(eid[v]);
                        for (int e = off[v]; e < off[v + 1]; e++) a.createRelationshipTo(tx.getNodeById(eid[dst[e]]), K);
                    }
                    tx.commit();
                }
            }
            eid = null;
            // The index was sampled empty, before the load: fresh statistics now, and no plan made
            // from the old ones. Left to Neo4j's background sampling, which ends at a time of its
            // own, a run's queries took 5 s or 13 s by the plan they happened to get.
            try (Transaction tx = db.beginTx()) {
                tx.execute("CALL db.prepareForReplanning(600)").close();
                tx.commit();
            }
            tLoad = System.nanoTime();

            expectRow(db, "MATCH (a:P) RETURN count(a) AS nodes", Map.of(), "node count", n);
            expectRow(db, "MATCH (:P)-[k:K]->(:P) RETURN count(k) AS edges", Map.of(), "edge count", edges);
            queries += 2;
            SplittableRandom rnd = new SplittableRandom(seed * 7919 + 1);
            for (int r = 0; r < rounds; r++) {
                int v = rnd.nextInt(n);
                Map<String, Object> p = Map.of("id", (long) v);
                expectRow(db, "MATCH (a:P {id: $id})-[:K]->(b) RETURN count(b) AS c, sum(b.id) AS s", p,
                          "out-neighbours of " + v, off[v + 1] - off[v], outSum[v]);
                expectRow(db, "MATCH (a:P {id: $id})<-[:K]-(b) RETURN count(b) AS c, sum(b.id) AS s", p,
                          "in-neighbours of " + v, indeg[v], inSum[v]);
                long c2 = 0, s2 = 0;
                for (int e = off[v]; e < off[v + 1]; e++) {
                    int t = dst[e];
                    c2 += off[t + 1] - off[t];
                    s2 += outSum[t];
                    // A pattern uses a relationship once: a self-loop is not its own second hop.
                    if (t == v) { c2--; s2 -= v; }
                }
                expectRow(db, "MATCH (a:P {id: $id})-[:K]->()-[:K]->(c) RETURN count(c) AS c, sum(c.id) AS s", p,
                          "two-hop paths from " + v, c2, s2);
                queries += 3;
                if (r % 4 == 3) {
                    int u = rnd.nextInt(n);
                    long d = 1 + rnd.nextInt(1000);
                    expectRow(db, "MATCH (a:P {id: $id}) SET a.w = a.w + $d RETURN a.w AS w",
                              Map.of("id", (long) u, "d", d), "update of " + u, w[u] + d);
                    w[u] += d;
                    groupW[u % GROUPS] += d;
                    queries++;
                }
                if ((r + 1) % scanEvery == 0 && r + 1 < rounds) {
                    scans(db, groupEdges, groupTargetSum, groupW, histogram);
                    queries += 3;
                }
            }
            scans(db, groupEdges, groupTargetSum, groupW, histogram);
            queries += 3;
            tQuery = System.nanoTime();
        } finally {
            dbms.shutdown();
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted(Comparator.reverseOrder()).forEach(q -> q.toFile().delete());
            }
        }
        System.out.printf("neo4j: ok nodes=%d edges=%d queries=%d checksum=%016x load=%.2fs query=%.2fs%n",
                          n, edges, queries, checksum, (tLoad - t0) / 1e9, (tQuery - tLoad) / 1e9);
    }

    /** The whole-graph aggregations: Cypher's grouping tables live on the Java heap. */
    static void scans(GraphDatabaseService db, long[] groupEdges, long[] groupTargetSum, long[] groupW,
                      Map<Long, Long> histogram) {
        try (Transaction tx = db.beginTx()) {
            try (Result r = tx.execute("MATCH (a:P)-[:K]->(b:P) RETURN a.g AS g, count(*) AS c, sum(b.id) AS s")) {
                int seen = 0;
                while (r.hasNext()) {
                    Map<String, Object> row = r.next();
                    int g = (int) (long) (Long) row.get("g");
                    long c = (Long) row.get("c"), s = (Long) row.get("s");
                    if (c != groupEdges[g] || s != groupTargetSum[g])
                        fail("edges of group " + g + ": " + c + " / " + s + ", expected " + groupEdges[g] + " / " + groupTargetSum[g]);
                    checksum = checksum * 31 + s;
                    seen++;
                }
                if (seen != GROUPS) fail("edges by group: " + seen + " groups");
            }
            try (Result r = tx.execute("MATCH (a:P)-[:K]->(b:P) WITH b, count(a) AS indeg "
                                       + "RETURN indeg, count(*) AS nodes")) {
                Map<Long, Long> got = new HashMap<>();
                while (r.hasNext()) {
                    Map<String, Object> row = r.next();
                    got.put((Long) row.get("indeg"), (Long) row.get("nodes"));
                }
                if (!got.equals(histogram)) fail("in-degree histogram: " + got.size() + " degrees, expected " + histogram.size());
                checksum = checksum * 31 + got.size();
            }
            try (Result r = tx.execute("MATCH (a:P) RETURN a.g AS g, sum(a.w) AS w")) {
                int seen = 0;
                while (r.hasNext()) {
                    Map<String, Object> row = r.next();
                    int g = (int) (long) (Long) row.get("g");
                    long sw = (Long) row.get("w");
                    if (sw != groupW[g]) fail("w of group " + g + ": " + sw + ", expected " + groupW[g]);
                    checksum = checksum * 31 + sw;
                    seen++;
                }
                if (seen != GROUPS) fail("w by group: " + seen + " groups");
            }
            tx.commit();
        }
    }
}
