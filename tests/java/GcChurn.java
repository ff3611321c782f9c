// SPDX-License-Identifier: Apache-2.0
/*
 * A GC-heavy program that checks its own heap. It keeps a live set of long[]
 * arrays whose contents are a function of (slot, version), replaces random
 * slots (old arrays become garbage: the collector copies and frees all the
 * time), allocates short-lived garbage besides, spot-checks slots as it goes
 * and checks every slot at the end. Exit 0 only if every word is right.
 *
 *   java -Xmx512m -cp build/java GcChurn [--live-mb 200] [--seconds 10 | --steps N]
 *
 * Prints "gcchurn: ready" once the live set is built (tests attach after it).
 */
import java.util.SplittableRandom;

public final class GcChurn {
    static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static long base(int slot, int version) {
        return mix(((long) slot << 32) ^ version ^ 0x5DEECE66DL);
    }

    static long[] make(int slot, int version, int len) {
        long[] a = new long[len];
        long b = base(slot, version);
        for (int i = 0; i < len; i++) a[i] = b ^ (i * 0x9E3779B97F4A7C15L);
        return a;
    }

    static int lenOf(int slot, int version) {
        return 256 + (int) ((base(slot, version) >>> 1) % 3840); // 2 KiB .. 32 KiB
    }

    static boolean check(long[][] live, int[] ver, int slot) {
        long[] a = live[slot];
        int v = ver[slot];
        if (a == null || a.length != lenOf(slot, v)) {
            System.out.printf("gcchurn: CORRUPT slot %d: length %d, want %d%n", slot,
                              a == null ? -1 : a.length, lenOf(slot, v));
            return false;
        }
        long b = base(slot, v);
        for (int i = 0; i < a.length; i++) {
            if (a[i] != (b ^ (i * 0x9E3779B97F4A7C15L))) {
                System.out.printf("gcchurn: CORRUPT slot %d word %d: %016x, want %016x%n", slot, i, a[i],
                                  b ^ (i * 0x9E3779B97F4A7C15L));
                return false;
            }
        }
        return true;
    }

    public static void main(String[] args) throws Exception {
        long liveMb = 200, steps = -1;
        double seconds = 10;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--live-mb": liveMb = Long.parseLong(args[++i]); break;
                case "--seconds": seconds = Double.parseDouble(args[++i]); break;
                case "--steps": steps = Long.parseLong(args[++i]); break;
                default: System.err.println("usage: GcChurn [--live-mb N] [--seconds S | --steps N]"); System.exit(2);
            }
        }
        int slots = (int) (liveMb * 1024 * 1024 / (17 * 1024 + 16));
        long[][] live = new long[slots][];
        int[] ver = new int[slots];
        for (int s = 0; s < slots; s++) live[s] = make(s, 0, lenOf(s, 0));
        System.out.printf("gcchurn: ready slots=%d live=%d MiB%n", slots, liveMb);
        System.out.flush();

        SplittableRandom rnd = new SplittableRandom(42);
        long t0 = System.nanoTime(), deadline = t0 + (long) (seconds * 1e9);
        long done = 0, checked = 0, sink = 0;
        boolean ok = true;
        while (ok && (steps >= 0 ? done < steps : System.nanoTime() < deadline)) {
            for (int k = 0; k < 256; k++, done++) {
                int s = rnd.nextInt(slots);
                int v = ver[s] + 1;
                live[s] = make(s, v, lenOf(s, v));
                ver[s] = v;
                long[] junk = new long[64 + rnd.nextInt(512)]; // dies young
                junk[junk.length - 1] = done;
                sink += junk[junk.length - 1];
                if ((done & 15) == 0) {
                    ok &= check(live, ver, rnd.nextInt(slots));
                    checked++;
                }
            }
            if (done % (256 * 400) == 0) {
                System.out.printf("gcchurn: step %d, %.1f s%n", done, (System.nanoTime() - t0) / 1e9);
                System.out.flush();
            }
        }
        for (int s = 0; ok && s < slots; s++) ok = check(live, ver, s);
        long sum = 0;
        for (int s = 0; s < slots; s++) sum += ver[s];
        System.out.printf("gcchurn: %s steps=%d spot_checks=%d versions=%d sink=%d %.1f s%n", ok ? "ok" : "FAILED",
                          done, checked, sum, sink, (System.nanoTime() - t0) / 1e9);
        System.exit(ok ? 0 : 1);
    }
}
