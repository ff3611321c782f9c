#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A sweep of Debian's programs under farmem, as a user would try them: each command runs all
local, then under `farmem run --threshold 1M --local 25%` (a low threshold, so that the programs'
ordinary malloc blocks are paged too, not only the big ones), and the two outputs must be the same
bytes. It looks for what the compatibility matrix (bench_compat.py) would miss: libc paths into
paged memory that no cover sees (probing the paths these programs take found glibc's futex
waits, getrandom and native AIO, docs/compatibility.md). It is a functional sweep with timings beside it, not a comparison with
Linux swap: at 25% of a few MiB, kswap mode's allowance for the rest of the process holds the
whole program.

    python3 bench/bench_sweep.py [--only perl,jq] [--scale 1] [--local 25%] [--threshold 1M]
                                 [--fault thread] [--repeats 1] [--before DIR] [--json results.json]

--before DIR runs each program a third time under another build of farmem (DIR: its build/ tree,
as FARMEM_BUILD; a worktree of an older commit after `make`), right after this build's run, for
a before-and-after in one sitting; --repeats runs the three that many times, interleaved. Both
farmem runs get FARMEM_BUILD, and DIR's absolute path must be as long as this build's: a program's
faults move with the size of its environment (bench/RESULTS.md, session 62), so a longer path
alone would read as a change of the pager's.

LibreOffice runs only when --only names it (OPT_IN).

Prints one line per program: same output or not, seconds all local and under farmem, their ratio,
faults, and the largest process's peak resident set all local (GNU time's %M). Exit status 1 if any output differed or a
run failed. Needs GNU time (/usr/bin/time) and the programs of PROGRAMS (Debian packages; a missing one is
skipped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THIS_BUILD = str(REPO / "build")
sys.path.insert(0, str(REPO / "bench" / "lib"))
from compat import ERLANG  # noqa: E402  (the same program as the compatibility matrix's)

JS = """const m = new Map(); let s = 0; const n = N;
for (let i = 0; i < n; i++) m.set('k' + i, {i, v: [i, i * 2, 'x' + (i % 1000)]});
for (let r = 0; r < 3; r++) for (let i = 0; i < n; i += 7) { const o = m.get('k' + ((i * 7919) % n)); o.v[1] += r; s += o.v[1] % 13; }
const a = Array.from(m.keys()).sort(); console.log(s, a.length, a[12345 % n]);
"""
PERL = """my $n = N; my %h; for my $i (0..$n) { $h{"k$i"} = [$i, "v" x ($i % 50)]; }
my $s = 0; for my $r (0..2) { for (my $i = 0; $i < $n; $i += 3) { my $k = "k" . (($i * 7919) % $n); $h{$k}[0] += $r; $s += $h{$k}[0] % 13; } }
my @k = sort keys %h; print "$s ", scalar(@k), " $k[12345 % $n]\\n";
"""
PHP = """<?php $n = N; $h = []; for ($i = 0; $i <= $n; $i++) $h["k$i"] = [$i, str_repeat("v", $i % 50)];
$s = 0; for ($r = 0; $r < 3; $r++) for ($i = 0; $i < $n; $i += 3) { $k = "k" . (($i * 7919) % $n); $h[$k][0] += $r; $s += $h[$k][0] % 13; }
$k = array_keys($h); sort($k, SORT_STRING); echo "$s " . count($k) . " " . $k[12345 % $n] . "\\n";
"""
RUBY = """n = N; h = {}; (0..n).each { |i| h["k#{i}"] = [i, "v" * (i % 50)] }
s = 0; 3.times { |r| (0...n).step(3) { |i| o = h["k#{(i * 7919) % n}"]; o[0] += r; s += o[0] % 13 } }
k = h.keys.sort; puts "#{s} #{k.size} #{k[12345 % n]}"
"""
LUA = """local n = N; local h = {}; for i = 0, n do h["k" .. i] = {i, string.rep("v", i % 50)} end
local s = 0; for r = 0, 2 do for i = 0, n - 1, 3 do local o = h["k" .. ((i * 7919) % n)]; o[1] = o[1] + r; s = s + o[1] % 13 end end
local k = {}; for key in pairs(h) do k[#k + 1] = key end; table.sort(k); print(s, #k, k[(12345 % n) + 1])
"""
LISP = """(let ((h (make-hash-table :test 'equal)) (n N) (s 0))
  (dotimes (i (1+ n)) (setf (gethash (format nil "k~D" i) h) (list i (make-string (mod i 50) :initial-element #\\v))))
  (dotimes (r 3) (loop for i from 0 below n by 3 do (let ((o (gethash (format nil "k~D" (mod (* i 7919) n)) h)))
    (incf (first o) r) (incf s (mod (first o) 13)))))
  (let ((k (sort (loop for key being the hash-keys of h collect key) #'string<)))
    (format t "~D ~D ~A~%" s (length k) (nth (mod 12345 n) k))))
"""
SCHEME = """(define n N) (define h (make-hash-table)) (define s 0)
(do ((i 0 (+ i 1))) ((> i n)) (hash-set! h (string-append "k" (number->string i)) (list i (make-string (modulo i 50) #\\v))))
(do ((r 0 (+ r 1))) ((= r 3)) (do ((i 0 (+ i 3))) ((>= i n))
  (let ((o (hash-ref h (string-append "k" (number->string (modulo (* i 7919) n))))))
    (set-car! o (+ (car o) r)) (set! s (+ s (modulo (car o) 13))))))
(define k (sort (hash-map->list (lambda (key v) key) h) string<?))
(format #t "~a ~a ~a~%" s (length k) (list-ref k (modulo 12345 n)))
"""
R = """set.seed(1); n <- N
x <- runif(n); k <- sprintf("k%d", sample.int(n))
d <- data.frame(k = k, x = x, g = sample.int(1000, n, TRUE))
a <- aggregate(x ~ g, data = d, FUN = sum)
s <- sort(k)
m <- matrix(runif(600 * 600), 600); p <- m %*% m
cat(sprintf("%.6f %s %.6f %d\\n", sum(a$x), s[12345], sum(diag(p)), length(unique(d$g))))
"""
OCTAVE = """rand("seed", 7); n = N;
A = rand(n) + n*eye(n); x = A \\ (A*ones(n,1)); assert(norm(x - 1, inf) < 1e-8);
[Q, R] = qr(A); assert(norm(Q*R - A, 1) / norm(A, 1) < 1e-12);
v = rand(8*n*n, 1); s = sort(v); assert(issorted(s));
c = cellfun(@(k) sprintf("k%d", k), num2cell(1:50*n), "UniformOutput", false);
p = strsplit(strjoin(c, ","), ","); assert(isequal(p, c));
y = real(ifft(fft(cumsum(v(1:2^20))))); assert(norm(y - cumsum(v(1:2^20)), inf) < 1e-6);
printf("%.6f %.6f %s %d\\n", sum(diag(R)) / n, s(12345), p{777}, numel(p));
"""
PY = """n = N
d = {}
for i in range(n): d["k%d" % i] = [i, "v" * (i % 50)]
s = 0
for r in range(3):
    for i in range(0, n, 3):
        o = d["k%d" % ((i * 7919) % n)]; o[0] += r; s += o[0] % 13
k = sorted(d); print(s, len(k), k[12345 % n])
"""

TCL = """set n N
set d [dict create]
for {set i 0} {$i < $n} {incr i} { dict set d k$i [list $i [string repeat x 40]] }
for {set r 0} {$r < 3} {incr r} {
  for {set j 0} {$j < $n} {incr j 3} { dict set d k[expr {($j*7919+$r) % $n}] [list $r$j [string repeat y 40]] }
}
set s 0
dict for {k v} $d { incr s [string length [lindex $v 0]] }
set ks [lsort [dict keys $d]]
puts "$s [lindex $ks 1000] [llength $ks]"
"""
# A repository built by fast-import from fast-import.txt, packed hard with two threads, checked.
GIT = ("rm -rf repo && git init -q -b main repo && cd repo && git fast-import --quiet < ../fast-import.txt && "
       "git -c pack.threads=2 gc -q --aggressive && git fsck --full --no-progress && "
       "git rev-list --all --objects | sort | sha256sum && git log --stat main | sha256sum")

# name, Debian program it needs, shell command (run in the work directory; stdout is compared)
PROGRAMS = [
    ("python", "python3", "python3 prog.py"),
    ("perl", "perl", "perl prog.pl"),
    ("php", "php", "php -d memory_limit=-1 prog.php"),
    ("ruby", "ruby", "ruby prog.rb"),
    ("lua", "lua5.4", "lua5.4 prog.lua"),
    # SBCL maps its heap with syscall(SYS_mmap) (paged since session 38); Guile's is Boehm's collector's
    ("sbcl", "sbcl", "sbcl --dynamic-space-size 1024 --script prog.lisp"),
    ("guile", "guile", "guile --no-auto-compile prog.scm"),
    ("node", "node", "node prog.js"),
    ("erlang", "erl", "erl -noshell -eval \"$(cat prog.erl)\""),
    ("r", "Rscript", "Rscript prog.R"),
    ("octave", "octave-cli", "octave-cli -q prog.m"),
    ("pandoc", "pandoc", "pandoc doc.md -t html | sha256sum"),
    ("libreoffice", "soffice", "rm -rf lo-profile lo-out && soffice -env:UserInstallation=file://$PWD/lo-profile "
     "--headless --norestore --convert-to txt:Text --outdir lo-out doc.html >/dev/null && sha256sum lo-out/doc.txt"),
    ("ffmpeg-threads", "ffmpeg", "ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc2=size=1280x720:rate=25 -t 10 "
     "-c:v libx264 -preset medium -threads 2 -f md5 -"),
    ("jq", "jq", "jq -c '[.[] | select(.v > 0.5) | .name] | sort | .[1000:1010]' big.json"),
    ("gcc", "gcc", "gcc -O2 -c big.c -o big.o && sha256sum big.o"),
    ("clang", "clang", "clang -O2 -c big.c -o big-clang.o && sha256sum big-clang.o"),
    # rustup's rustc links jemalloc into the executable (it hung at its start until session 44)
    ("rustc", "rustc", "rustc -O -o big-rs big.rs && ./big-rs && sha256sum big-rs"),
    ("tcl", "tclsh", "tclsh prog.tcl"),
    ("git", "git", GIT),
    ("mawk", "mawk", "mawk '{for(i=1;i<=NF;i++) c[$i]++} END {n=0; for(w in c) n+=c[w]; print n, length(c)}' text.txt"),
    ("bzip2", "bzip2", "bzip2 -9 -c text.txt | sha256sum"),
    ("gzip", "gzip", "gzip -9 -c text.txt | gzip -d | sha256sum"),
    ("sort-parallel", "sort", "LC_ALL=C sort -S 64M --parallel=2 text.txt | sha256sum"),
    ("xz-threads", "xz", "xz -T2 -6 -c text.txt | xz -d | sha256sum"),
    ("zstd-threads", "zstd", "zstd -T2 -12 --long=26 -c text.txt | zstd -d --long=26 | sha256sum"),
]

# Run only when named in --only: LibreOffice's main heap at --threshold 1M --local 25% thrashes for
# longer than the timeout (9.3M faults in 300 s, 3.8 s all local; bench/RESULTS.md, session 36).
OPT_IN = {"libreoffice"}


def make_inputs(work: Path, scale: float) -> None:
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(20000)]
    size = int(32 * scale) << 20
    with open(work / "text.txt", "w") as f:
        n = 0
        while n < size:
            line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
            f.write(line)
            n += len(line)
    rows = int(400000 * scale)
    (work / "big.json").write_text(json.dumps(
        [{"id": i, "name": rng.choice(words), "tags": [rng.choice(words) for _ in range(5)], "v": rng.random()}
         for i in range(rows)]))
    with open(work / "big.c", "w") as f:
        funcs = int(3000 * scale)
        for i in range(funcs):
            f.write(f"int f{i}(int x){{ int a[16]; for(int j=0;j<16;j++) a[j]=x*{i}+j; int s=0; "
                    f"for(int j=0;j<16;j++) s+=a[j]*a[(j*{i % 7 + 1})%16]; return s ^ {rng.randint(0, 999)}; }}\n")
        f.write("int main(void){ int s=0;\n" + "".join(f"s+=f{i}({i});\n" for i in range(funcs)) + "return s & 1; }\n")
    with open(work / "doc.md", "w") as f:
        for i in range(int(2500 * scale)):
            f.write(f"# Section {i}\n\n" + " ".join(rng.choice(words) for _ in range(80)) +
                    f"\n\n* item *em* **strong** `code`\n* [link](http://x/{i})\n\n")
    with open(work / "doc.html", "w") as f:
        f.write("<html><body>\n")
        for i in range(int(2500 * scale)):
            f.write(f"<h1>Section {i}</h1>\n<p>" + " ".join(rng.choice(words) for _ in range(80)) +
                    f"</p>\n<ul><li><em>item</em> <b>{i}</b></li><li><a href='http://x/{i}'>link</a></li></ul>\n")
        f.write("</body></html>\n")
    keys = str(int(2000000 * scale))
    (work / "prog.py").write_text(PY.replace("N", keys, 1))
    (work / "prog.pl").write_text(PERL.replace("N", keys, 1))
    (work / "prog.php").write_text(PHP.replace("N", keys, 1))
    (work / "prog.rb").write_text(RUBY.replace("N", keys, 1))
    (work / "prog.lua").write_text(LUA.replace("N", keys, 1))
    (work / "prog.lisp").write_text(LISP.replace("N", keys, 1))
    (work / "prog.scm").write_text(SCHEME.replace("N", keys, 1))
    (work / "prog.js").write_text(JS.replace("N", str(int(3000000 * scale)), 1))
    (work / "prog.erl").write_text(ERLANG.format(n=int(400000 * scale)))
    (work / "prog.R").write_text(R.replace("N", str(int(600000 * scale)), 1))
    (work / "prog.m").write_text(OCTAVE.replace("N", str(int(1500 * scale)), 1))
    (work / "prog.tcl").write_text(TCL.replace("N", str(int(600000 * scale)), 1))
    with open(work / "big.rs", "w") as f:
        funcs = int(400 * scale)
        for i in range(funcs):
            f.write(f"fn f{i}(x: u64) -> u64 {{ let mut v: Vec<u64> = (0..{i % 50 + 10}).map(|k| k * x + {i}).collect(); "
                    f"v.sort(); v.iter().fold({i}, |a, b| a.wrapping_mul(31).wrapping_add(*b)) }}\n")
        f.write("fn main() { let mut acc: u64 = 1;\n" + "".join(f"acc = acc.wrapping_add(f{i}(acc));\n" for i in range(funcs))
                + "println!(\"{}\", acc); }\n")
    with open(work / "fast-import.txt", "w") as f:
        files = {}
        for c in range(int(6000 * scale)):
            f.write(f"commit refs/heads/main\nmark :{c + 1}\ncommitter A <a@example.org> {1700000000 + c} +0000\n"
                    f"data 8\ncommit{c % 10}\n" + (f"from :{c}\n" if c else ""))
            for _ in range(5):
                name = f"d{rng.randint(0, 40)}/f{rng.randint(0, 400)}.txt"
                body = (" ".join(rng.choice(words) for _ in range(rng.randint(50, 600))) + "\n").encode()
                files[name] = body
                f.write(f"M 100644 inline {name}\ndata {len(body)}\n")
                f.write(body.decode())
            f.write("\n")


# Debian's programs, not what a machine puts before them in PATH: this one's python3 was pyenv's
# shim, a bash script that forked 40 times before Python started (each fork under farmem brings
# the paged memory home first).
DEBIAN_ENV = dict(os.environ, PATH="/usr/bin:/bin:/usr/sbin:/sbin:" + os.environ.get("PATH", ""))


def run(argv: list, work: Path, timeout: float, env_extra: dict | None = None) -> tuple:
    """Run argv in a session of its own, in DEBIAN_ENV with env_extra; past the timeout the whole
    session is killed (the shell's pipeline too, not only its first process) and the run counts as
    failed (status -9)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(DEBIAN_ENV, **(env_extra or {})))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\nbench_sweep: killed after {timeout:.0f} s\n".encode()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), time.monotonic() - t0


def farmem_once(args, work: Path, name: str, cmd: str, build: str) -> tuple:
    """CMD under `farmem run` with build as FARMEM_BUILD: (CompletedProcess, seconds, summary)."""
    summary = work / f"{name}.json"
    summary.unlink(missing_ok=True)
    fault = ["--fault", args.fault] if args.fault else []
    fm, fm_s = run([str(REPO / "farmem"), "run", "--threshold", args.threshold, "--local", args.local, *fault,
                    "--summary-json", str(summary), "--", "bash", "-c", cmd], work, args.timeout,
                   {"FARMEM_BUILD": build})
    return fm, fm_s, json.loads(summary.read_text()) if summary.exists() else {}


def sweep_one(args, work: Path, name: str, cmd: str, results: list) -> int:
    """One round of a program: all local, this build, the build before (--before). 1 if an output differed."""
    rss = work / f"{name}.rss"
    local, local_s = run(["/usr/bin/time", "-f", "%M", "-o", str(rss), "bash", "-c", cmd], work, args.timeout)
    peak_kib = int(rss.read_text().split()[-1]) if rss.exists() else 0
    bad = 0
    for build in [THIS_BUILD, args.before] if args.before else [THIS_BUILD]:
        fm, fm_s, s = farmem_once(args, work, name, cmd, build)
        same = local.returncode == 0 and fm.returncode == 0 and local.stdout == fm.stdout
        bad |= not same
        row = {"program": name, "command": cmd, "build": "this" if build == THIS_BUILD else build, "same": same,
               "local_s": round(local_s, 2), "farmem_s": round(fm_s, 2),
               "ratio": round(fm_s / local_s, 2) if local_s else None,
               "faults": s.get("faults", 0), "heap_faults": s.get("heap_faults", 0),
               "processes": s.get("processes", 0), "peak_rss_mib_local": round(peak_kib / 1024, 1),
               "output_sha256": hashlib.sha256(local.stdout).hexdigest()[:16]}
        if not same:
            row["farmem_stderr"] = fm.stderr.decode(errors="replace")[-800:]
        results.append(row)
        paged = "not paged" if not row["processes"] else \
            f"{row['faults']} faults ({row['heap_faults']} by the heaps' handler thread)"
        which = f" (build {build})" if build != THIS_BUILD else ""
        print(f"{name}{which}: {'same output' if same else 'DIFFERENT OUTPUT OR FAILED'}, {row['local_s']} s local, "
              f"{row['farmem_s']} s farmem ({row['ratio']}x), {paged}, largest process all local "
              f"{row['peak_rss_mib_local']} MiB", flush=True)
        if not same:
            print(row["farmem_stderr"], flush=True)
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(p[0] for p in PROGRAMS if p[0] not in OPT_IN))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--local", default="25%")
    ap.add_argument("--threshold", default="1M")
    ap.add_argument("--fault", help="farmem run's --fault (thread also pages glibc's heaps of the programs' threads)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--before", help="another build's build/ directory (FARMEM_BUILD), run third")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.before:
        args.before = os.path.abspath(args.before)
        if len(args.before) != len(THIS_BUILD):
            ap.error(f"--before {args.before}: its path is {len(args.before)} characters, this build's "
                     f"({THIS_BUILD}) {len(THIS_BUILD)}; a program's faults move with the size of its "
                     "environment, so give the other build a path of the same length (a worktree named to fit)")
        if not os.path.isfile(os.path.join(args.before, "lib", "libfarmem_preload.so")):
            ap.error(f"--before {args.before}: no farmem build there (lib/libfarmem_preload.so missing)")
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="farmem-sweep-"))
    results, bad = [], 0
    try:
        make_inputs(work, args.scale)
        for name, need, cmd in PROGRAMS:
            if name not in only:
                continue
            if not shutil.which(need, path=DEBIAN_ENV["PATH"]):
                print(f"{name}: skipped ({need} is not installed)", flush=True)
                continue
            for _ in range(args.repeats):
                bad += sweep_one(args, work, name, cmd, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
