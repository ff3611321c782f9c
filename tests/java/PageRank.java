// SPDX-License-Identifier: Apache-2.0
/*
 * A PageRank-like graph analytic in plain Java: a synthetic power-law-ish
 * graph in CSR arrays (a large, long-lived live set that every iteration
 * sweeps), iterated a fixed number of times. Self-checks: the ranks sum to
 * 1 within 1e-6, and the printed digest is deterministic for given
 * arguments (compare runs with and without farmem).
 *
 *   java -Xmx1g -cp build/java PageRank [--nodes 2000000] [--degree 10] [--iters 10]
 */
import java.util.SplittableRandom;

public final class PageRank {
    public static void main(String[] args) {
        int nodes = 2_000_000, degree = 10, iters = 10;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--nodes": nodes = Integer.parseInt(args[++i]); break;
                case "--degree": degree = Integer.parseInt(args[++i]); break;
                case "--iters": iters = Integer.parseInt(args[++i]); break;
                default: System.err.println("usage: PageRank [--nodes N] [--degree D] [--iters K]"); System.exit(2);
            }
        }
        long t0 = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(7);
        // Out-degree per node: 1 .. 2*degree-1; a few hubs get many in-links.
        int[] off = new int[nodes + 1];
        for (int v = 0; v < nodes; v++) off[v + 1] = off[v] + 1 + rnd.nextInt(2 * degree - 1);
        int[] dst = new int[off[nodes]];
        for (int v = 0; v < nodes; v++) {
            for (int e = off[v]; e < off[v + 1]; e++) {
                int r = rnd.nextInt(100);
                dst[e] = r < 30 ? rnd.nextInt(Math.max(1, nodes / 1000))          // hubs
                       : r < 70 ? Math.floorMod(v + rnd.nextInt(2001) - 1000, nodes) // locality
                       : rnd.nextInt(nodes);                                      // anywhere
            }
        }
        System.out.printf("pagerank: graph %d nodes, %d edges, %.1f s%n", nodes, dst.length, (System.nanoTime() - t0) / 1e9);
        double[] rank = new double[nodes], next = new double[nodes];
        java.util.Arrays.fill(rank, 1.0 / nodes);
        final double d = 0.85;
        for (int it = 0; it < iters; it++) {
            java.util.Arrays.fill(next, (1 - d) / nodes);
            for (int v = 0; v < nodes; v++) {
                double share = d * rank[v] / (off[v + 1] - off[v]);
                for (int e = off[v]; e < off[v + 1]; e++) next[dst[e]] += share;
            }
            double[] t = rank; rank = next; next = t;
            // Per-iteration garbage, as real analytics make: boxed top-k candidates.
            java.util.ArrayList<Double> top = new java.util.ArrayList<>();
            for (int v = 0; v < nodes; v += 97) top.add(rank[v]);
        }
        double sum = 0, max = 0;
        long digest = 0;
        int best = 0;
        for (int v = 0; v < nodes; v++) {
            sum += rank[v];
            if (rank[v] > max) { max = rank[v]; best = v; }
            digest = digest * 31 + Math.round(rank[v] * 1e12);
        }
        boolean ok = Math.abs(sum - 1.0) < 1e-6;
        System.out.printf("pagerank: %s sum=%.9f top=%d (%.3e) digest=%016x %.1f s%n", ok ? "ok" : "FAILED",
                          sum, best, max, digest, (System.nanoTime() - t0) / 1e9);
        System.exit(ok ? 0 : 1);
    }
}
