// SPDX-License-Identifier: Apache-2.0
/*
 * Full GCs over many large arrays whose every element is checked: the workload
 * for SwapVA compaction (a farmem JDK's -XX:+UseFarmemSwapVA moves the whole
 * pages of large objects instead of copying them) and its benchmark.
 *
 * It keeps a table of large arrays (long[] and byte[], --min-kb .. --max-kb,
 * below G1's humongous size with 8 MiB regions) interleaved with small ones,
 * each filled with a pattern of its own tag. Every round frees a random
 * fraction of both and allocates new ones in their place, then asks for a
 * full GC (System.gc(), which is a full GC in G1 with
 * -XX:-ExplicitGCInvokesConcurrent, the default), then checks every element of
 * every array it holds. Sliding compaction moves the survivors by amounts that
 * are not whole pages, which is what SwapVA must handle (padding).
 *
 *   java -Xmx512m -XX:G1HeapRegionSize=8m -cp build/java LargeArrays
 *        [--arrays 150] [--min-kb 300] [--max-kb 2048] [--rounds 6] [--free-pct 40] [--seed 1]
 *        [--squeeze]   (each round also fills the heap until an OutOfMemoryError: full GCs
 *                       with no region to free, which G1 compacts serially; then checks again)
 *
 * Prints one line per round with the full-GC pause the JVM reports
 * ("round N: gc-ms X ...") and exits 0 with "largearrays: ok ..." only if every
 * element of every array was right after every collection.
 */
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.SplittableRandom;

public final class LargeArrays {
    static Object[] big, small;
    static long[] bigTag, smallTag;
    static long checked;

    static long pat(long tag, int i) {
        long z = tag + i * 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        return z ^ (z >>> 31);
    }

    static Object make(long tag, int bytes) {
        if ((tag & 1) == 0) {
            long[] a = new long[bytes / 8];
            for (int i = 0; i < a.length; i++) a[i] = pat(tag, i);
            return a;
        }
        byte[] b = new byte[bytes];
        for (int i = 0; i < b.length; i++) b[i] = (byte) (tag * 31 + i * 7 + (i >>> 9));
        return b;
    }

    static void check(Object o, long tag, String what, int round) {
        if (o instanceof long[]) {
            long[] a = (long[]) o;
            for (int i = 0; i < a.length; i++) {
                if (a[i] != pat(tag, i)) fail(String.format("round %d: %s long[%d] tag %d element %d reads %016x, want %016x",
                                                            round, what, a.length, tag, i, a[i], pat(tag, i)));
            }
        } else {
            byte[] b = (byte[]) o;
            for (int i = 0; i < b.length; i++) {
                if (b[i] != (byte) (tag * 31 + i * 7 + (i >>> 9)))
                    fail(String.format("round %d: %s byte[%d] tag %d element %d reads %d", round, what, b.length, tag, i, b[i]));
            }
        }
        checked++;
    }

    static void fail(String msg) {
        System.out.println("largearrays: FAILED " + msg);
        System.exit(1);
    }

    static long gcMillis() {
        long t = 0;
        for (GarbageCollectorMXBean b : ManagementFactory.getGarbageCollectorMXBeans()) t += b.getCollectionTime();
        return t;
    }

    public static void main(String[] args) {
        int arrays = 150, minKb = 300, maxKb = 2048, rounds = 6, freePct = 40;
        long seed = 1;
        boolean squeeze = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--arrays": arrays = Integer.parseInt(args[++i]); break;
                case "--min-kb": minKb = Integer.parseInt(args[++i]); break;
                case "--max-kb": maxKb = Integer.parseInt(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                case "--free-pct": freePct = Integer.parseInt(args[++i]); break;
                case "--seed": seed = Long.parseLong(args[++i]); break;
                case "--squeeze": squeeze = true; break;
                default:
                    System.err.println("usage: LargeArrays [--arrays N] [--min-kb K] [--max-kb K] [--rounds R] [--free-pct P] [--seed S] [--squeeze]");
                    System.exit(2);
            }
        }
        if (arrays < 1 || minKb < 1 || maxKb < minKb || rounds < 1 || freePct < 0 || freePct > 100) {
            System.err.println("largearrays: bad arguments");
            System.exit(2);
        }
        SplittableRandom rnd = new SplittableRandom(seed);
        big = new Object[arrays];
        bigTag = new long[arrays];
        small = new Object[arrays * 8];
        smallTag = new long[small.length];
        long tag = 1;
        // Interleaved: a large array, then a few small ones, so that freeing the small ones slides the large.
        for (int k = 0; k < arrays; k++) {
            bigTag[k] = tag++;
            big[k] = make(bigTag[k], (minKb + rnd.nextInt(maxKb - minKb + 1)) * 1024 + rnd.nextInt(64) * 8);
            for (int j = 0; j < 8; j++) {
                int s = k * 8 + j;
                smallTag[s] = tag++;
                small[s] = make(smallTag[s], 16 + rnd.nextInt(4000) * 8);
            }
        }
        long totalGcMs = 0, totalBig = 0;
        for (int round = 1; round <= rounds; round++) {
            int freed = 0;
            for (int k = 0; k < arrays; k++) {
                if (rnd.nextInt(100) < freePct) {
                    bigTag[k] = tag++;
                    big[k] = null;
                    freed++;
                }
            }
            for (int s = 0; s < small.length; s++) {
                if (rnd.nextInt(100) < 70) small[s] = null;
            }
            // New arrays where old ones died: allocated after the survivors, so compaction slides them.
            for (int k = 0; k < arrays; k++) {
                if (big[k] == null) big[k] = make(bigTag[k], (minKb + rnd.nextInt(maxKb - minKb + 1)) * 1024 + rnd.nextInt(64) * 8);
            }
            for (int s = 0; s < small.length; s++) {
                if (small[s] == null && rnd.nextInt(100) < 30) {
                    smallTag[s] = tag++;
                    small[s] = make(smallTag[s], 16 + rnd.nextInt(4000) * 8);
                }
            }
            long g0 = gcMillis(), t0 = System.nanoTime();
            System.gc();
            long wall = (System.nanoTime() - t0) / 1000000, gc = gcMillis() - g0;
            totalGcMs += gc;
            for (int k = 0; k < arrays; k++) check(big[k], bigTag[k], "large", round);
            for (int s = 0; s < small.length; s++) if (small[s] != null) check(small[s], smallTag[s], "small", round);
            long live = 0;
            for (int k = 0; k < arrays; k++) live += big[k] instanceof long[] ? ((long[]) big[k]).length * 8L : ((byte[]) big[k]).length;
            totalBig = live;
            System.out.printf("round %d: gc-ms %d wall-ms %d large-replaced %d large-live-mb %d%n",
                              round, gc, wall, freed, live >> 20);
            if (squeeze) {
                // Fill the heap with large fillers until allocation fails: G1's last full GCs before
                // the OutOfMemoryError find no region to free and compact serially (phase 2c),
                // moving this table's arrays too. Then let the fillers go, and check everything.
                java.util.ArrayList<byte[]> fill = new java.util.ArrayList<>(4096);
                int n = 0;
                try {
                    while (true) {
                        fill.add(new byte[512 * 1024]);
                        n++;
                    }
                } catch (OutOfMemoryError e) {
                    fill = null;
                }
                System.gc();
                for (int k = 0; k < arrays; k++) check(big[k], bigTag[k], "large", round);
                for (int s = 0; s < small.length; s++) if (small[s] != null) check(small[s], smallTag[s], "small", round);
                System.out.printf("round %d: squeezed in %d fillers of 512 KiB until the heap was full%n", round, n);
            }
        }
        System.out.printf("largearrays: ok rounds=%d arrays=%d checked=%d gc-ms=%d large-live-mb=%d%n",
                          rounds, arrays, checked, totalGcMs, totalBig >> 20);
    }
}
