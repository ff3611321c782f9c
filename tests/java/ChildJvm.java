// SPDX-License-Identifier: Apache-2.0
/*
 * A JVM that starts another program, usually another JVM, as build tools
 * and launchers do (Maven Surefire's forks, Elasticsearch's launcher): under
 * `farmem run -- java ... ChildJvm java ...` the child JVM gets the agent
 * too (tests/test_jvm.py).
 *
 *   java -cp build/java ChildJvm COMMAND [ARGS...]
 *
 * Runs COMMAND with this JVM's environment and standard streams, and exits
 * with its status after printing "childjvm: child exited N".
 */
public final class ChildJvm {
    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: ChildJvm COMMAND [ARGS...]");
            System.exit(2);
        }
        int rc = new ProcessBuilder(args).inheritIO().start().waitFor();
        System.out.println("childjvm: child exited " + rc);
        System.exit(rc);
    }
}
