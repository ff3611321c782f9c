// SPDX-License-Identifier: Apache-2.0
/*
 * One of the seeds' workloads (issue 18): PageRank on Apache Spark (spark-core, from Maven
 * Central: tests/java/spark/pom.xml), in local mode, over a generated graph, the shape MemLiner
 * and Semeru measured. Spark's own RDDs hold the data: the adjacency lists are grouped
 * (groupByKey) and cached as deserialized Java objects, so the Java heap that farmem pages is
 * full of Spark's boxed tuples and buffers; every iteration joins them with the ranks and
 * shuffles the contributions (reduceByKey).
 *
 * The graph (tests/java/seedgraph/SeedGraph.java) is a pure function of (node, edge number,
 * --seed) with no dangling node, so the ranks sum to 1. Spark generates it in its tasks; the
 * driver builds the same graph in CSR arrays and runs the same PageRank in plain Java; the run
 * passes only if
 *   - Spark's in-degree count (a groupBy-count over the edges) matches the CSR's exactly,
 *     node for node (compared through an order-free 64-bit weighted sum, and the count of nodes
 *     with in-links),
 *   - Spark's ranks cover every node once and each is within 1e-9 (relative) of plain Java's,
 *   - the ranks sum to 1 within 1e-9.
 * It prints "spark: ok ..." with a digest of the ranks (from the plain-Java computation, so it
 * does not depend on Spark's summation order: it must match an unpaged run with the same flags)
 * and exits 0, or "spark: MISMATCH ..." and exits 1.
 *
 *   java -Xmx1g -jar build/java/spark/spark-workload.jar [--nodes 400000] [--degree 8]
 *        [--iters 5] [--partitions 8] [--seed 1] [--master local[2]] [--self-test-corrupt]
 *
 * --self-test-corrupt alters one rank of the plain-Java reference: the run must then fail.
 *
 * The jar's manifest carries the classpath (build/java/spark/lib) and the --add-opens Spark 3.5
 * needs on JDK 17; with -cp instead, pass them yourself (docs/seeds.md). Spark refuses a heap
 * under about 450 MiB (its reserved 300 MiB times 1.5), so -Xmx512m is the smallest.
 */
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.HashPartitioner;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

public final class SparkPageRank {
    static final double DAMPING = 0.85;

    /** A wrong answer: thrown, so that the Spark context stops (and deletes its files) first. */
    static final class Mismatch extends RuntimeException {
        Mismatch(String what) { super(what); }
    }

    static void fail(String what) {
        throw new Mismatch(what);
    }

    /** The same PageRank in plain Java on CSR arrays; returns the ranks and fills indeg. */
    static double[] reference(SeedGraph g, int iters, int[] indeg) {
        int n = g.nodes;
        int[] off = new int[n + 1];
        for (int v = 0; v < n; v++) off[v + 1] = off[v] + g.outDegree(v);
        int[] dst = new int[off[n]];
        for (int v = 0; v < n; v++)
            for (int j = 0, e = off[v]; e < off[v + 1]; j++, e++) {
                dst[e] = g.target(v, j);
                indeg[dst[e]]++;
            }
        double[] rank = new double[n], next = new double[n];
        java.util.Arrays.fill(rank, 1.0 / n);
        for (int it = 0; it < iters; it++) {
            java.util.Arrays.fill(next, 0.0);
            for (int v = 0; v < n; v++) {
                double share = rank[v] / (off[v + 1] - off[v]);
                for (int e = off[v]; e < off[v + 1]; e++) next[dst[e]] += share;
            }
            for (int v = 0; v < n; v++) next[v] = (1 - DAMPING) / n + DAMPING * next[v];
            double[] t = rank; rank = next; next = t;
        }
        return rank;
    }

    public static void main(String[] args) throws Exception {
        try {
            run(args);
        } catch (Mismatch m) {
            System.out.println("spark: MISMATCH " + m.getMessage());
            System.exit(1);
        }
    }

    static void run(String[] args) throws Exception {
        int nodes = 400_000, degree = 8, iters = 5, parts = 8;
        long seed = 1;
        String master = "local[2]";
        boolean corrupt = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--nodes": nodes = Integer.parseInt(args[++i]); break;
                case "--degree": degree = Integer.parseInt(args[++i]); break;
                case "--iters": iters = Integer.parseInt(args[++i]); break;
                case "--partitions": parts = Integer.parseInt(args[++i]); break;
                case "--seed": seed = Long.parseLong(args[++i]); break;
                case "--master": master = args[++i]; break;
                case "--self-test-corrupt": corrupt = true; break;
                default:
                    System.err.println("usage: SparkPageRank [--nodes N] [--degree D] [--iters K] [--partitions P] "
                                       + "[--seed S] [--master local[2]] [--self-test-corrupt]");
                    System.exit(2);
            }
        }
        if (nodes < 1000 || degree < 1 || iters < 1 || parts < 1) {
            System.err.println("spark: --nodes >= 1000, --degree, --iters and --partitions >= 1");
            System.exit(2);
        }
        long t0 = System.nanoTime();
        final SeedGraph g = new SeedGraph(nodes, degree, seed);
        final int n = nodes, p = parts;

        int[] indeg = new int[n];
        double[] expected = reference(g, iters, indeg);
        long expWeighted = 0, expWithIn = 0, expEdges = 0;
        for (int v = 0; v < n; v++) {
            expWeighted += SeedGraph.mix(v) * indeg[v];
            expEdges += indeg[v];
            if (indeg[v] > 0) expWithIn++;
        }
        indeg = null;
        if (corrupt) expected[n / 2] *= 1.001; // the check must catch one wrong rank
        long tRef = System.nanoTime();

        SparkConf conf = new SparkConf().setMaster(master).setAppName("farmem-spark-pagerank")
                .set("spark.ui.enabled", "false")
                .set("spark.driver.host", "127.0.0.1")
                .set("spark.driver.bindAddress", "127.0.0.1")
                .set("spark.default.parallelism", Integer.toString(p));
        long weighted, withIn, edgeCount, rankCount;
        double rankSum, worst;
        int worstNode;
        try (JavaSparkContext sc = new JavaSparkContext(conf)) {
            List<Integer> slices = new ArrayList<>();
            for (int i = 0; i < p; i++) slices.add(i);
            JavaPairRDD<Integer, Integer> edges = sc.parallelize(slices, p).flatMapToPair(s -> {
                List<Tuple2<Integer, Integer>> out = new ArrayList<>();
                int lo = (int) ((long) n * s / p), hi = (int) ((long) n * (s + 1) / p);
                for (int v = lo; v < hi; v++)
                    for (int j = 0, d = g.outDegree(v); j < d; j++) out.add(new Tuple2<>(v, g.target(v, j)));
                return out.iterator();
            });
            HashPartitioner part = new HashPartitioner(p);
            // The live set: every node's out-links, grouped and kept as Java objects.
            JavaPairRDD<Integer, Iterable<Integer>> links = edges.groupByKey(part).persist(StorageLevel.MEMORY_ONLY());

            // The groupBy-count check: in-degrees, folded into order-free sums.
            JavaPairRDD<Integer, Long> inCounts = links.values()
                    .flatMapToPair(ts -> { List<Tuple2<Integer, Long>> o = new ArrayList<>();
                                           for (int t : ts) o.add(new Tuple2<>(t, 1L)); return o.iterator(); })
                    .reduceByKey(Long::sum);
            Tuple2<Long, Long> folded = inCounts.map(t -> new Tuple2<>(SeedGraph.mix(t._1) * t._2, t._2))
                    .fold(new Tuple2<>(0L, 0L), (a, b) -> new Tuple2<>(a._1 + b._1, a._2 + b._2));
            weighted = folded._1;
            edgeCount = folded._2;
            withIn = inCounts.count();

            JavaPairRDD<Integer, Double> ranks = links.mapValues(x -> 1.0 / n);
            for (int it = 0; it < iters; it++) {
                // Each node also sends itself 0, so a node nobody links to keeps a rank.
                JavaPairRDD<Integer, Double> contribs = links.join(ranks).flatMapToPair(e -> {
                    List<Tuple2<Integer, Double>> o = new ArrayList<>();
                    int deg = 0;
                    for (int ignored : e._2._1) deg++;
                    double share = e._2._2 / deg;
                    o.add(new Tuple2<>(e._1, 0.0));
                    for (int t : e._2._1) o.add(new Tuple2<>(t, share));
                    return o.iterator();
                });
                ranks = contribs.reduceByKey(part, Double::sum).mapValues(s -> (1 - DAMPING) / n + DAMPING * s);
            }
            ranks = ranks.persist(StorageLevel.MEMORY_ONLY());
            Broadcast<double[]> exp = sc.broadcast(expected);
            // (count, sum, worst relative error, its node), folded over every rank Spark computed.
            Tuple2<Tuple2<Long, Double>, Tuple2<Double, Integer>> r = ranks.map(t -> {
                double want = exp.value()[t._1];
                double err = Math.abs(t._2 - want) / want;
                return new Tuple2<>(new Tuple2<>(1L, t._2), new Tuple2<>(err, t._1));
            }).fold(new Tuple2<>(new Tuple2<>(0L, 0.0), new Tuple2<>(0.0, -1)), (a, b) -> new Tuple2<>(
                    new Tuple2<>(a._1._1 + b._1._1, a._1._2 + b._1._2),
                    a._2._1 >= b._2._1 ? a._2 : b._2));
            rankCount = r._1._1;
            rankSum = r._1._2;
            worst = r._2._1;
            worstNode = r._2._2;
            long distinct = ranks.keys().distinct().count();
            if (distinct != rankCount) fail("ranks: " + rankCount + " entries for " + distinct + " nodes");
        }
        long t1 = System.nanoTime();

        if (edgeCount != expEdges) fail("edges: spark counted " + edgeCount + ", the generator made " + expEdges);
        if (withIn != expWithIn) fail("nodes with in-links: spark " + withIn + ", plain Java " + expWithIn);
        if (weighted != expWeighted) fail("in-degree weighted sum: spark " + weighted + ", plain Java " + expWeighted);
        if (rankCount != n) fail("ranks: spark has " + rankCount + " nodes, the graph " + n);
        if (!(worst <= 1e-9)) fail("rank of node " + worstNode + ": relative error " + worst);
        if (!(Math.abs(rankSum - 1.0) <= 1e-9)) fail("ranks sum to " + rankSum);
        long digest = 0;
        for (double x : expected) digest = digest * 31 + Math.round(x * 1e12);
        System.out.printf("spark: ok nodes=%d edges=%d iters=%d sum=%.12f maxrelerr=%.2e digest=%016x "
                          + "reference=%.2fs spark=%.2fs%n", n, expEdges, iters, rankSum, worst, digest,
                          (tRef - t0) / 1e9, (t1 - tRef) / 1e9);
    }
}
