// SPDX-License-Identifier: Apache-2.0
/*
 * A JVM starting programs with ProcessBuilder while it holds a big array
 * (issue 19, tests/test_spawn.py). Under `farmem run --local` most of the
 * array is in memd when the children start.
 *
 *   java -Xmx512m -cp build/java SpawnHolder [--mb 256] [--times 3] [--child /bin/false]
 *
 * JDK 17 on Linux starts a child by posix_spawn of jspawnhelper, which execs
 * the program (jdk.lang.Process.launchMechanism=POSIX_SPAWN, the default);
 * -Djdk.lang.Process.launchMechanism=FORK makes it fork() instead, which is
 * what the test sets for contrast. Every child must exit 1 (/bin/false: it
 * ran), and every element of the array is checked after the spawns. Prints
 * "spawnholder: ok ..." and exits 0 only if all of that held.
 */
public final class SpawnHolder {
    static long pat(int i) {
        long z = i * 0x9E3779B97F4A7C15L + 0x5EEDL;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        return z ^ (z >>> 31) ^ 1; /* never 0, so an element read as zero fails */
    }

    public static void main(String[] args) throws Exception {
        int mb = 256, times = 3;
        String child = "/bin/false";
        for (int k = 0; k + 1 < args.length; k += 2) {
            switch (args[k]) {
                case "--mb": mb = Integer.parseInt(args[k + 1]); break;
                case "--times": times = Integer.parseInt(args[k + 1]); break;
                case "--child": child = args[k + 1]; break;
                default: throw new IllegalArgumentException("unknown option " + args[k]);
            }
        }
        long[] a = new long[mb * 131072];
        for (int i = 0; i < a.length; i++) a[i] = pat(i);
        for (int t = 0; t < times; t++) {
            int rc = new ProcessBuilder(child).inheritIO().start().waitFor();
            if (rc != 1) {
                System.out.println("spawnholder: FAILED: child exit status " + rc + ", want 1");
                System.exit(1);
            }
        }
        long bad = 0;
        for (int i = 0; i < a.length; i++) if (a[i] != pat(i)) bad++;
        if (bad != 0) {
            System.out.println("spawnholder: FAILED: " + bad + " elements wrong after the spawns");
            System.exit(1);
        }
        String mech = System.getProperty("jdk.lang.Process.launchMechanism");
        System.out.println("spawnholder: ok " + times + " children, launch mechanism "
                           + (mech == null ? "default" : mech));
    }
}
