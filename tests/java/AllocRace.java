// SPDX-License-Identifier: Apache-2.0
/*
 * Hunts the race that discarding freed heap space could have: allocation right
 * after a GC pause, into space the agent discarded during that pause.
 *
 * Several threads allocate as fast as they can (long[] of 1 KiB .. 1.5 MiB, a
 * few humongous ones for G1), check that every new array reads as zeros (Java's
 * guarantee: a page that lost a write the JVM made while zeroing, or that
 * brought back stale garbage, shows here), write a pattern of (thread, seq)
 * into it at once, read it back, and keep it in a ring for a while so that it
 * survives several collections (copied by the GC, or promoted) before it is
 * checked a last time and dropped. Every few hundred allocations a thread
 * asks for a full GC (System.gc()) so that all pause kinds happen.
 *
 *   java -Xmx256m -cp build/java AllocRace [--seconds 10] [--threads 3] [--ring 64] [--no-full-gc]
 *
 * Exit 0 and "allocrace: ok ..." only if every word of every array was right.
 */
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicLong;

public final class AllocRace {
    static final AtomicLong allocated = new AtomicLong(), arrays = new AtomicLong(), checks = new AtomicLong();
    static volatile String failure;

    static long pat(long tag, int i) {
        long z = tag + i * 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        return z ^ (z >>> 31);
    }

    static boolean verify(long[] a, long tag, String when) {
        for (int i = 0; i < a.length; i++) {
            if (a[i] != pat(tag, i)) {
                failure = String.format("%s: array tag %x (%d words) word %d reads %016x, want %016x",
                                        when, tag, a.length, i, a[i], pat(tag, i));
                return false;
            }
        }
        checks.incrementAndGet();
        return true;
    }

    static void worker(int id, long deadline, int ringSize, boolean fullGc) {
        SplittableRandom rnd = new SplittableRandom(id * 7919L + 1);
        long[][] ring = new long[ringSize][];
        long[] tags = new long[ringSize];
        long seq = 0;
        while (failure == null && System.nanoTime() < deadline) {
            int r = rnd.nextInt(1000);
            // mostly small, some medium, a few large (humongous with G1's 1 MiB regions)
            int words = r < 900 ? 128 + rnd.nextInt(4096) : r < 995 ? 8192 + rnd.nextInt(32768)
                                                                     : 65536 + rnd.nextInt(131072);
            long tag = ((long) id << 48) ^ seq++;
            long[] a = new long[words];
            for (int i = 0; i < words; i++) {
                if (a[i] != 0) {
                    failure = String.format("new array (%d words) word %d reads %016x, not zero", words, i, a[i]);
                    return;
                }
            }
            for (int i = 0; i < words; i++) a[i] = pat(tag, i);
            if (!verify(a, tag, "just written")) return;
            int slot = rnd.nextInt(ringSize);
            if (ring[slot] != null && !verify(ring[slot], tags[slot], "kept across GCs")) return;
            ring[slot] = a;
            tags[slot] = tag;
            allocated.addAndGet(16 + 8L * words);
            arrays.incrementAndGet();
            if (fullGc && id == 0 && seq % 5000 == 0) System.gc();
        }
        for (int s = 0; s < ringSize; s++)
            if (ring[s] != null && !verify(ring[s], tags[s], "at the end")) return;
    }

    public static void main(String[] args) throws Exception {
        double seconds = 10;
        int threads = 3, ring = 64;
        boolean fullGc = true;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--seconds": seconds = Double.parseDouble(args[++i]); break;
                case "--threads": threads = Integer.parseInt(args[++i]); break;
                case "--ring": ring = Integer.parseInt(args[++i]); break;
                case "--no-full-gc": fullGc = false; break;
                default: throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        long t0 = System.nanoTime(), deadline = t0 + (long) (seconds * 1e9);
        final int ringSize = ring;
        final boolean fg = fullGc;
        Thread[] ts = new Thread[threads];
        for (int i = 0; i < threads; i++) {
            final int id = i;
            ts[i] = new Thread(() -> worker(id, deadline, ringSize, fg), "allocrace-" + i);
            ts[i].start();
        }
        for (Thread t : ts) t.join();
        long gcs = 0;
        for (GarbageCollectorMXBean b : ManagementFactory.getGarbageCollectorMXBeans()) gcs += Math.max(0, b.getCollectionCount());
        if (failure != null) {
            System.out.println("allocrace: CORRUPT " + failure);
            System.exit(1);
        }
        System.out.printf("allocrace: ok arrays=%d checks=%d allocated_mb=%d gcs=%d %.1f s%n", arrays.get(),
                          checks.get(), allocated.get() >> 20, gcs, (System.nanoTime() - t0) / 1e9);
    }
}
