// SPDX-License-Identifier: Apache-2.0
/*
 * The third-party workload (issue 3): the H2 database (com.h2database:h2, fetched from Maven
 * Central by `make build/java/thirdparty/.ok`, tests/java/thirdparty/pom.xml), in-memory, driven
 * through plain JDBC. Its tables, indexes and MVStore pages live in the Java heap, so farmem pages
 * a real database engine nobody here wrote.
 *
 * Inserts --rows rows (id, k, v, s) in batches, builds an index on k, then runs --rounds rounds of
 * indexed point/aggregate queries, primary-key range sums, point lookups of s and indexed updates.
 * Every answer is checked against what this program computes itself; a full GROUP BY k check ends
 * the run. Prints "h2: ok ..." and exits 0, or "h2: MISMATCH ..." and exits 1.
 *
 *   java -Xmx512m -cp build/java:build/java/thirdparty/h2.jar H2Workload [--rows 600000] [--rounds 3000]
 */
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.SplittableRandom;

public final class H2Workload {
    static final int KEYS = 1000;

    static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static int keyOf(long id) { return (int) Long.remainderUnsigned(mix(id), KEYS); }
    static long valOf(long id) { return mix(id ^ 0x5DEECE66DL) & 0xFFFFFFFL; }
    static String strOf(long id) {
        long a = mix(id * 31 + 7), b = mix(a);
        return Long.toHexString(a) + "-" + Long.toHexString(b) + "-" + id;
    }

    static void fail(String what) {
        System.out.println("h2: MISMATCH " + what);
        System.exit(1);
    }

    public static void main(String[] args) throws Exception {
        int rows = 600_000, rounds = 3000;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--rows": rows = Integer.parseInt(args[++i]); break;
                case "--rounds": rounds = Integer.parseInt(args[++i]); break;
                default: System.err.println("unknown argument " + args[i]); System.exit(2);
            }
        }
        long t0 = System.nanoTime();
        long[] cnt = new long[KEYS], sum = new long[KEYS];
        long[] delta = new long[rows]; // what updates added to each row's v
        int[] key = new int[rows];
        try (Connection c = DriverManager.getConnection("jdbc:h2:mem:farmem;DB_CLOSE_DELAY=-1", "sa", "")) {
            try (Statement st = c.createStatement()) {
                st.execute("CREATE TABLE t(id BIGINT PRIMARY KEY, k INT NOT NULL, v BIGINT NOT NULL, s VARCHAR(80) NOT NULL)");
            }
            c.setAutoCommit(false);
            try (PreparedStatement ins = c.prepareStatement("INSERT INTO t VALUES (?, ?, ?, ?)")) {
                for (int id = 0; id < rows; id++) {
                    int k = keyOf(id);
                    long v = valOf(id);
                    key[id] = k;
                    cnt[k]++;
                    sum[k] += v;
                    ins.setLong(1, id); ins.setInt(2, k); ins.setLong(3, v); ins.setString(4, strOf(id));
                    ins.addBatch();
                    if (id % 5000 == 4999) { ins.executeBatch(); c.commit(); }
                }
                ins.executeBatch();
                c.commit();
            }
            try (Statement st = c.createStatement()) {
                st.execute("CREATE INDEX tk ON t(k)");
            }
            c.commit();
            long tLoad = System.nanoTime();
            SplittableRandom rnd = new SplittableRandom(42);
            long queries = 0;
            try (PreparedStatement byK = c.prepareStatement("SELECT COUNT(*), SUM(v) FROM t WHERE k = ?");
                 PreparedStatement range = c.prepareStatement("SELECT COUNT(*), SUM(v) FROM t WHERE id BETWEEN ? AND ?");
                 PreparedStatement point = c.prepareStatement("SELECT k, v, s FROM t WHERE id = ?");
                 PreparedStatement upd = c.prepareStatement("UPDATE t SET v = v + ? WHERE k = ?")) {
                for (int r = 0; r < rounds; r++) {
                    int k = rnd.nextInt(KEYS);
                    byK.setInt(1, k);
                    try (ResultSet rs = byK.executeQuery()) {
                        rs.next();
                        if (rs.getLong(1) != cnt[k] || rs.getLong(2) != sum[k])
                            fail("k=" + k + ": count " + rs.getLong(1) + " sum " + rs.getLong(2) + ", expected " + cnt[k] + " " + sum[k]);
                    }
                    int lo = rnd.nextInt(rows), hi = Math.min(rows - 1, lo + rnd.nextInt(2000));
                    long es = 0;
                    for (int id = lo; id <= hi; id++) es += valOf(id) + delta[id];
                    range.setLong(1, lo); range.setLong(2, hi);
                    try (ResultSet rs = range.executeQuery()) {
                        rs.next();
                        if (rs.getLong(1) != hi - lo + 1 || rs.getLong(2) != es)
                            fail("range " + lo + ".." + hi + ": sum " + rs.getLong(2) + ", expected " + es);
                    }
                    for (int j = 0; j < 8; j++) {
                        int id = rnd.nextInt(rows);
                        point.setLong(1, id);
                        try (ResultSet rs = point.executeQuery()) {
                            if (!rs.next() || rs.getInt(1) != key[id] || rs.getLong(2) != valOf(id) + delta[id]
                                    || !rs.getString(3).equals(strOf(id)))
                                fail("row " + id);
                        }
                    }
                    if (r % 10 == 0) { // an indexed update: MVStore rewrites pages, old ones become garbage
                        int uk = rnd.nextInt(KEYS), add = 1 + rnd.nextInt(100);
                        upd.setInt(1, add); upd.setInt(2, uk);
                        int n = upd.executeUpdate();
                        if (n != cnt[uk]) fail("update k=" + uk + " touched " + n + " rows, expected " + cnt[uk]);
                        c.commit();
                        sum[uk] += (long) add * n;
                        for (int id = 0; id < rows; id++) if (key[id] == uk) delta[id] += add;
                    }
                    queries += 10;
                }
            }
            long total = 0, totalSum = 0;
            try (Statement st = c.createStatement();
                 ResultSet rs = st.executeQuery("SELECT k, COUNT(*), SUM(v) FROM t GROUP BY k ORDER BY k")) {
                int seen = 0;
                while (rs.next()) {
                    int k = rs.getInt(1);
                    if (rs.getLong(2) != cnt[k] || rs.getLong(3) != sum[k]) fail("final k=" + k);
                    total += rs.getLong(2);
                    totalSum += rs.getLong(3);
                    seen++;
                }
                long nonEmpty = 0;
                for (long x : cnt) if (x > 0) nonEmpty++;
                if (seen != nonEmpty || total != rows) fail("final: " + seen + " keys, " + total + " rows");
            }
            long t1 = System.nanoTime();
            System.out.printf("h2: ok rows=%d queries=%d checksum=%d load=%.2fs query=%.2fs%n", rows, queries, totalSum,
                              (tLoad - t0) / 1e9, (t1 - tLoad) / 1e9);
        }
    }
}
