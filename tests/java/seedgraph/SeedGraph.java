// SPDX-License-Identifier: Apache-2.0
/*
 * The graph both seed workloads run on (tests/java/spark, tests/java/neo4j; compiled into each
 * jar): a pure function of (node, edge number, seed), so a workload can generate it where it
 * likes (Spark, in its tasks) and still know every answer. Out-degree 1 .. 2*degree-1, so no node
 * is dangling; targets are 30% hubs (the first nodes/1000 nodes), 40% neighbours (within 1000),
 * 30% anywhere. Self-loops and repeated edges happen, as in real graphs.
 */
public final class SeedGraph implements java.io.Serializable {
    private static final long serialVersionUID = 1L;

    public final int nodes, degree;
    public final long seed;

    public SeedGraph(int nodes, int degree, long seed) {
        this.nodes = nodes;
        this.degree = degree;
        this.seed = seed;
    }

    public static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    public int outDegree(int v) {
        return 1 + (int) Long.remainderUnsigned(mix(seed * 0x9E3779B97F4A7C15L ^ v), 2L * degree - 1);
    }

    public int target(int v, int j) {
        long h = mix(mix(seed ^ ((long) v << 20) ^ j) + v);
        int r = (int) Long.remainderUnsigned(h, 100);
        long x = h >>> 8;
        if (r < 30) return (int) (x % Math.max(1, nodes / 1000));
        if (r < 70) return Math.floorMod(v + (int) (x % 2001) - 1000, nodes);
        return (int) (x % nodes);
    }
}
