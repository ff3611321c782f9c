// SPDX-License-Identifier: Apache-2.0
/*
 * An object-graph workload for MemLiner (bench/bench_memliner.py): a live set of small linked
 * nodes (the shape MemLiner's Spark/graph workloads have), which the program sweeps over and over,
 * rebuilding a share of the lists every sweep (old-generation garbage: concurrent marking cycles)
 * and allocating short-lived garbage. Self-checking: every list's sum is checked on every sweep.
 *
 *   java -Xmx512m -cp DIR ObjGraph [--live-mb 150] [--sweeps 20] [--lists 4096] [--rebuild-pct 12]
 */
import java.util.SplittableRandom;

public final class ObjGraph {
    static final class Node {
        final long v;
        final Node next;
        Node(long v, Node next) { this.v = v; this.next = next; }
    }

    static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static Node build(int list, int version, int len) {
        Node n = null;
        for (int i = 0; i < len; i++) n = new Node(mix(((long) list << 40) ^ ((long) version << 20) ^ i), n);
        return n;
    }

    static long expect(int list, int version, int len) {
        long s = 0;
        for (int i = 0; i < len; i++) s += mix(((long) list << 40) ^ ((long) version << 20) ^ i);
        return s;
    }

    public static void main(String[] args) {
        long liveMb = 150;
        int sweeps = 20, lists = 4096, rebuildPct = 12;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--live-mb": liveMb = Long.parseLong(args[++i]); break;
                case "--sweeps": sweeps = Integer.parseInt(args[++i]); break;
                case "--lists": lists = Integer.parseInt(args[++i]); break;
                case "--rebuild-pct": rebuildPct = Integer.parseInt(args[++i]); break;
                default: System.err.println("usage: ObjGraph [--live-mb N] [--sweeps N] [--lists N] [--rebuild-pct P]"); System.exit(2);
            }
        }
        int len = (int) (liveMb * 1024 * 1024 / 24 / lists);  // a Node is 24 bytes with compressed oops
        Node[] heads = new Node[lists];
        int[] ver = new int[lists];
        long[] sums = new long[lists];
        for (int l = 0; l < lists; l++) { heads[l] = build(l, 0, len); sums[l] = expect(l, 0, len); }
        System.out.printf("objgraph: ready lists=%d len=%d live=%d MiB%n", lists, len, liveMb);
        SplittableRandom rnd = new SplittableRandom(11);
        long t0 = System.nanoTime(), junkSink = 0;
        boolean ok = true;
        for (int s = 0; s < sweeps && ok; s++) {
            for (int l = 0; l < lists && ok; l++) {
                long sum = 0;
                int n = 0;
                for (Node x = heads[l]; x != null; x = x.next) { sum += x.v; n++; }
                if (n != len || sum != sums[l]) {
                    System.out.printf("objgraph: CORRUPT list %d: %d nodes, sum %d, want %d, %d%n", l, n, sum, len, sums[l]);
                    ok = false;
                }
                if (rnd.nextInt(100) < rebuildPct) {
                    int v = ++ver[l];
                    heads[l] = build(l, v, len);
                    sums[l] = expect(l, v, len);
                }
                long[] junk = new long[16 + rnd.nextInt(256)];
                junk[0] = sum;
                junkSink += junk[0];
            }
        }
        System.out.printf("objgraph: %s sweeps=%d sink=%d %.1f s%n", ok ? "ok" : "FAILED", sweeps, junkSink,
                          (System.nanoTime() - t0) / 1e9);
        System.exit(ok ? 0 : 1);
    }
}
