// SPDX-License-Identifier: Apache-2.0
/*
 * A GC-heavy program that checks its own heap. It keeps a live set of long[]
 * arrays whose contents are a function of (slot, version), replaces random
 * slots (old arrays become garbage: the collector copies and frees all the
 * time), allocates short-lived garbage besides, spot-checks slots as it goes
 * and checks every slot at the end. Exit 0 only if every word is right.
 *
 *   java -Xmx512m -cp build/java GcChurn [--live-mb 200] [--seconds 10 | --steps N]
 *        [--wait] [--grow-mb N] [--shrink-mb N] [--big-mb N] [--until-eof]
 *
 * Prints "gcchurn: ready" once the live set is built (tests attach after it);
 * with --wait it then waits for a line on stdin before it churns. --grow-mb:
 * the live set grows to N MiB as the churn starts (a JVM started small has
 * to expand its heap). --shrink-mb: halfway through the run (once grown; at
 * its end if it got there first) the live set drops to N MiB and System.gc() runs, so a JVM whose
 * -XX:MaxHeapFreeRatio allows it gives heap back; with --wait it waits for
 * another line then (a test looks at the shrunk heap). --big-mb: one array
 * of N MiB is allocated as the churn starts and checked at the end (a
 * humongous object: a JVM started small expands its heap for it between GC
 * pauses); with --wait it waits for another line after that. Each prints the
 * committed heap (Runtime.totalMemory) when it is done. --until-eof: the churn
 * also ends when stdin does (a test that attaches and detaches closes it when
 * it is done, rather than racing a fixed run's end; --seconds still bounds it).
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
        return check(live, ver, slot, slot);
    }

    /* Entry `at` of live, made for pattern slot `slot` (the big array's is -1, its length its own). */
    static boolean check(long[][] live, int[] ver, int at, int slot) {
        long[] a = live[at];
        int v = ver[at];
        if (a == null || (slot >= 0 && a.length != lenOf(slot, v))) {
            say("gcchurn: CORRUPT slot %d: length %d, want %d%n", slot,
                              a == null ? -1 : a.length, lenOf(slot, v));
            return false;
        }
        long b = base(slot, v);
        for (int i = 0; i < a.length; i++) {
            if (a[i] != (b ^ (i * 0x9E3779B97F4A7C15L))) {
                say("gcchurn: CORRUPT slot %d word %d: %016x, want %016x%n", slot, i, a[i],
                                  b ^ (i * 0x9E3779B97F4A7C15L));
                return false;
            }
        }
        return true;
    }

    static int slotsFor(long mb) {
        return (int) (mb * 1024 * 1024 / (17 * 1024 + 16));
    }

    static long committedMb() {
        return Runtime.getRuntime().totalMemory() >> 20;
    }

    /*
     * One write per line: printf hands System.out its pieces one by one, and the VM's own log
     * lines (-Xlog to stdout, from GC threads) landed between them ("gcchurn: " on one side of a
     * GC log line, "ok steps=..." on the other: a CI run of session 40 failed on it).
     */
    static void say(String fmt, Object... args) {
        System.out.print(String.format(fmt, args));
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        long liveMb = 200, steps = -1, growMb = 0, shrinkMb = -1, bigMb = 0;
        double seconds = 10;
        boolean wait = false, untilEof = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--live-mb": liveMb = Long.parseLong(args[++i]); break;
                case "--seconds": seconds = Double.parseDouble(args[++i]); break;
                case "--steps": steps = Long.parseLong(args[++i]); break;
                case "--wait": wait = true; break;
                case "--grow-mb": growMb = Long.parseLong(args[++i]); break;
                case "--shrink-mb": shrinkMb = Long.parseLong(args[++i]); break;
                case "--big-mb": bigMb = Long.parseLong(args[++i]); break;
                case "--until-eof": untilEof = true; break;
                default:
                    System.err.println("usage: GcChurn [--live-mb N] [--seconds S | --steps N] [--wait] [--grow-mb N] "
                                       + "[--shrink-mb N] [--big-mb N] [--until-eof]");
                    System.exit(2);
            }
        }
        // Slots [0, slots) are live; the table has room for the grown set.
        int slots = slotsFor(liveMb), target = Math.max(slots, slotsFor(growMb));
        long[][] live = new long[target][];
        int[] ver = new int[target];
        for (int s = 0; s < slots; s++) live[s] = make(s, 0, lenOf(s, 0));
        say("gcchurn: ready slots=%d live=%d MiB committed=%d MiB%n", slots, liveMb, committedMb());
        System.out.flush();
        java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
        if (wait && in.readLine() == null) {
            System.out.println("gcchurn: stdin closed before the start");
            System.exit(2);
        }
        long[] big = bigMb > 0 ? make(-1, 0, (int) (bigMb << 17)) : null;
        if (big != null) {
            say("gcchurn: big %d MiB committed=%d MiB%n", bigMb, committedMb());
            System.out.flush();
            if (wait && in.readLine() == null) {
                System.out.println("gcchurn: stdin closed after the big array");
                System.exit(2);
            }
        }

        java.util.concurrent.atomic.AtomicBoolean eof = new java.util.concurrent.atomic.AtomicBoolean();
        if (untilEof) {
            Thread reader = new Thread(() -> {
                try {
                    while (in.read() >= 0) { }
                } catch (java.io.IOException e) {
                    // a broken stdin ends the churn as its end does
                }
                eof.set(true);
            });
            reader.setDaemon(true);
            reader.start();
        }
        SplittableRandom rnd = new SplittableRandom(42);
        long t0 = System.nanoTime(), deadline = t0 + (long) (seconds * 1e9);
        long shrinkAt = shrinkMb >= 0 ? t0 + (long) (seconds * 0.5e9) : Long.MAX_VALUE;
        long done = 0, checked = 0, sink = 0;
        boolean ok = true, grown = slots == target;
        while (ok) {
            boolean more = (steps >= 0 ? done < steps : System.nanoTime() < deadline) && !eof.get();
            // Steps come 256 at a time: a slow run (a loaded machine, a verified heap) can pass both
            // the halfway mark and its end in one batch. It still shrinks, once, before it ends.
            if (!more && !(grown && shrinkAt != Long.MAX_VALUE)) break;
            if (!more) shrinkAt = 0;
            if (!grown && slots == target) {
                grown = true;
                say("gcchurn: grown slots=%d committed=%d MiB%n", slots, committedMb());
                System.out.flush();
            }
            if (grown && System.nanoTime() >= shrinkAt) {
                // Slots past the new size die: a full GC finds the heap mostly free.
                int to = Math.min(slots, slotsFor(shrinkMb));
                long before = committedMb();
                for (int s = to; s < slots; s++) live[s] = null;
                slots = target = to;
                System.gc();
                System.gc();
                say("gcchurn: shrunk slots=%d committed=%d MiB (was %d MiB)%n", slots, committedMb(),
                                  before);
                System.out.flush();
                shrinkAt = Long.MAX_VALUE;
                long w0 = System.nanoTime();
                if (wait && in.readLine() == null) {
                    System.out.println("gcchurn: stdin closed after the shrink");
                    System.exit(2);
                }
                deadline += System.nanoTime() - w0; // the churn's second half runs in full

            }
            for (int k = 0; k < 256; k++, done++) {
                if (slots < target) {
                    live[slots] = make(slots, 0, lenOf(slots, 0));
                    ver[slots] = 0;
                    slots++;
                }
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
                say("gcchurn: step %d, %.1f s%n", done, (System.nanoTime() - t0) / 1e9);
                System.out.flush();
            }
        }
        for (int s = 0; ok && s < slots; s++) ok = check(live, ver, s);
        if (ok && big != null) ok = check(new long[][] {big}, new int[] {0}, 0, -1);
        long sum = 0;
        for (int s = 0; s < slots; s++) sum += ver[s];
        say("gcchurn: %s steps=%d spot_checks=%d versions=%d sink=%d %.1f s%n", ok ? "ok" : "FAILED",
                          done, checked, sum, sink, (System.nanoTime() - t0) / 1e9);
        System.exit(ok ? 0 : 1);
    }
}
