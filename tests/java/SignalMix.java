// SPDX-License-Identifier: Apache-2.0
import java.io.File;
import java.io.RandomAccessFile;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.util.Random;

/**
 * A JVM's own signal handlers at work while its heap pages: with faults served in the faulting
 * thread, the pager's SIGBUS handler runs first and must hand every signal that is not a paging
 * fault to HotSpot's. Round after round it
 *
 *   - rewrites and checks a heap of --live-mb MiB of long arrays (paged: most of it remote),
 *   - reads a MappedByteBuffer whose file was truncated (HotSpot turns that SIGBUS into an
 *     InternalError),
 *   - dereferences null in a loop (HotSpot's implicit null checks: SIGSEGV into NPEs),
 *   - recurses until StackOverflowError (the stack guard pages: SIGSEGV).
 *
 * Prints "signalmix: ok" and exits 0 when every check held; exits 1 otherwise.
 *
 *   java -Xmx256m -cp build/java SignalMix [--live-mb 160] [--rounds 6]
 */
public class SignalMix {
    static int depth;

    static void recurse() {
        depth++;
        recurse();
    }

    static Object maybeNull(int i) {
        return (i & 1) == 0 ? null : "x";
    }

    public static void main(String[] args) throws Exception {
        int liveMb = 160, rounds = 6;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--live-mb": liveMb = Integer.parseInt(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                default: System.err.println("unknown argument " + args[i]); System.exit(2);
            }
        }
        int arrays = liveMb * 8, len = (1 << 17) / 8; /* 128 KiB arrays: not humongous */
        long[][] live = new long[arrays][];
        for (int a = 0; a < arrays; a++) {
            live[a] = new long[len];
            for (int k = 0; k < len; k++)
                live[a][k] = a * 1_000_003L + k;
        }
        File f = File.createTempFile("signalmix", ".bin");
        f.deleteOnExit();
        Random rnd = new Random(7);
        int bus = 0, npe = 0, soe = 0;
        for (int r = 0; r < rounds; r++) {
            // The heap: every array rewritten at random places, then all of it checked.
            for (int n = 0; n < 20000; n++) {
                int a = rnd.nextInt(arrays), k = rnd.nextInt(len);
                live[a][k] += 1L << 40;
            }
            // A mapped file cut short under the mapping: SIGBUS, HotSpot's to turn into an error.
            try (RandomAccessFile raf = new RandomAccessFile(f, "rw")) {
                raf.setLength(1 << 16);
                MappedByteBuffer mb = raf.getChannel().map(FileChannel.MapMode.READ_WRITE, 0, 1 << 16);
                mb.put(0, (byte) 1);
                raf.setLength(0);
                try {
                    mb.get(1 << 15);
                    System.err.println("signalmix: reading a truncated mapping did not fail");
                    System.exit(1);
                } catch (InternalError e) {
                    bus++;
                }
            }
            for (int i = 0; i < 10000; i++) {
                try {
                    maybeNull(i).hashCode();
                } catch (NullPointerException e) {
                    npe++;
                }
            }
            try {
                depth = 0;
                recurse();
            } catch (StackOverflowError e) {
                soe++;
            }
        }
        // Every value is its start value plus the rewrites counted into its high bits.
        long bad = 0;
        for (int a = 0; a < arrays; a++)
            for (int k = 0; k < len; k++)
                if ((live[a][k] & ((1L << 40) - 1)) != a * 1_000_003L + k)
                    bad++;
        if (bad != 0 || bus != rounds || soe != rounds || npe != rounds * 5000) {
            System.err.printf("signalmix: FAILED bad=%d sigbus=%d npe=%d soe=%d%n", bad, bus, npe, soe);
            System.exit(1);
        }
        System.out.printf("signalmix: ok rounds=%d live=%d MiB sigbus->InternalError=%d npe=%d soe=%d%n",
                rounds, liveMb, bus, npe, soe);
    }
}
