#!/usr/bin/env bash
# Build the farmem JDK: Debian 12's openjdk-17 source + hotspot/patches/*.patch -> `make hotspot`
# -> the patched libjvm.so installed into a private copy of the same-version Debian JDK (headless).
# Measured recipe: ../shared/research/machine-jdk-build.md. Docs: docs/patched-jdk.md.
#
# Env: DEB_VERSION (source+binary version the mirror serves), PATCH_DIR, CACHE_DIR
#      (default ~/.cache/farmem-jdk17), JOBS (default nproc).
# Progress goes to stderr; the JDK home is the only line on stdout.
# Cache: $CACHE_DIR/<upstream version>-<hash of this script + patches>/jdk. The source/build tree
# ($CACHE_DIR/work-<version>) is shared between keys, so a changed patch set rebuilds incrementally.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEB_VERSION=${DEB_VERSION:-17.0.19+10-1~deb12u2}
UP=${DEB_VERSION%-*}                                  # 17.0.19+10
PATCH_DIR=${PATCH_DIR:-$HERE/patches}
CACHE=${CACHE_DIR:-$HOME/.cache/farmem-jdk17}
JOBS=${JOBS:-$(nproc)}
T0=$(date +%s)
say() { printf '[jdk %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

mapfile -t P < <(find "$PATCH_DIR" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)
KEY=$({ echo "$DEB_VERSION"; sha256sum <"${BASH_SOURCE[0]}"
        for p in "${P[@]}"; do basename "$p"; sha256sum <"$p"; done; } | sha256sum | cut -c1-12)
OUT=$CACHE/$UP-$KEY
if [ "${1:-}" = --home ]; then [ -f "$OUT/.done" ] && { echo "$OUT/jdk"; exit 0; }; exit 2; fi
# A finished key never changes: no need to wait for the lock a build of another key holds.
if [ -f "$OUT/.done" ]; then say "cached: $OUT/jdk"; echo "$OUT/jdk"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9
if [ -f "$OUT/.done" ]; then say "cached: $OUT/jdk"; echo "$OUT/jdk"; exit 0; fi
say "building farmem JDK $UP key $KEY (${#P[@]} patches, JOBS=$JOBS)"

# --- tools: autoconf is the only build dependency missing from a plain Debian 12 + JDK 17 ------
need=()
command -v autoconf >/dev/null || need+=(autoconf)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2
fi

# --- deb-src: a separate deb822 file next to the system's debian.sources (never edited) ------
SRCLIST=/etc/apt/sources.list.d/farmem-deb-src.sources
if ! apt-get source --print-uris -qq "openjdk-17=$DEB_VERSION" >/dev/null 2>&1; then
  if [ ! -f "$SRCLIST" ]; then
    say "adding deb-src entry $SRCLIST"
    sudo_ tee "$SRCLIST" >/dev/null <<'SRC'
# Added by farmem hotspot/build.sh: source packages for the patched JDK build.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  say "apt-get update"
  sudo_ apt-get update -q >&2
fi

W=$CACHE/work-$UP; S=$W/src; mkdir -p "$W/dl"
if [ ! -f "$W/dl/.ok" ]; then
  say "downloading openjdk-17 $DEB_VERSION source and the jre/jdk-headless .debs"
  (cd "$W/dl" && apt-get source -q --download-only "openjdk-17=$DEB_VERSION" &&
     apt-get download -q "openjdk-17-jre-headless=$DEB_VERSION" "openjdk-17-jdk-headless=$DEB_VERSION") >&2
  touch "$W/dl/.ok"
fi
if [ ! -d "$S" ]; then
  say "unpacking the upstream tarball (without test/)"
  rm -rf "$S.tmp"; mkdir -p "$S.tmp"
  tar -xJf "$W/dl/openjdk-17_$UP.orig.tar.xz" -C "$S.tmp" --strip-components=1 --exclude="openjdk-17-$UP/test"
  mv "$S.tmp" "$S"
fi

# --- patches: revert what the tree carries, dry-run the new set, apply --------------------------
# Files whose content ends up the same keep their mtime: re-applying a patch to logTag.hpp must
# not rebuild all of HotSpot.
mkdir -p "$W/applied"
mapfile -t A < <(ls "$W"/applied/*.patch 2>/dev/null | LC_ALL=C sort)
same=1; [ ${#A[@]} = ${#P[@]} ] || same=0
for i in "${!P[@]}"; do [ $same = 1 ] && cmp -s "${P[$i]}" "${A[$i]:-/dev/null}" || same=0; done
if [ $same = 0 ]; then
  touched=$({ cat "${A[@]}" "${P[@]}" 2>/dev/null || true; } | sed -n 's#^+++ [^/]*/\([^[:space:]]*\).*#\1#p' | sort -u)
  snap=$W/mtimes; : >"$snap"
  for f in $touched; do [ -f "$S/$f" ] && echo "$f $(stat -c %Y "$S/$f") $(sha256sum <"$S/$f" | cut -c1-64)" >>"$snap"; done
  for p in $(ls "$W"/applied/*.patch 2>/dev/null | LC_ALL=C sort -r); do
    say "reverting $(basename "$p")"; patch -d "$S" -p1 -R -s <"$p"; rm "$p"
  done
  for p in "${P[@]}"; do
    if ! patch -d "$S" -p1 --forward --dry-run -s <"$p" >&2; then
      say "patch $(basename "$p") does not apply (the already applied ones are reverted on the next run)"; exit 1
    fi
    patch -d "$S" -p1 --forward -s <"$p"; cp "$p" "$W/applied/"; say "applied $(basename "$p")"
  done
  while read -r f t h; do
    [ -f "$S/$f" ] && [ "$(sha256sum <"$S/$f" | cut -c1-64)" = "$h" ] && touch -d "@$t" "$S/$f"
  done <"$snap"
else
  say "patches already applied: ${#P[@]}"
fi

# --- configure (stub headers: `make hotspot` never compiles cups/alsa/fontconfig) --------------
ST=$W/stubs
mkdir -p "$ST/cups" "$ST/alsa" "$ST/fontconfig"
for h in cups/cups.h cups/ppd.h alsa/asoundlib.h fontconfig/fontconfig.h; do
  [ -s "$ST/$h" ] || echo "/* farmem build stub: configure checks for it, make hotspot never includes it */" >"$ST/$h"
done
BOOT=${BOOT_JDK:-$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")}
if [ ! -f "$S/build/release/spec.gmk" ]; then
  say "configure (boot JDK $BOOT)"
  (cd "$S" && bash configure --with-conf-name=release --with-boot-jdk="$BOOT" --with-jvm-variants=server \
     --with-debug-level=release --with-native-debug-symbols=none --enable-headless-only \
     --disable-warnings-as-errors --with-cups-include="$ST" --with-alsa-include="$ST" \
     --with-fontconfig-include="$ST" --with-freetype=bundled --with-zlib=bundled \
     --with-version-pre= --with-version-build="${UP#*+}" --with-version-opt=farmem) >"$W/configure.log" 2>&1 \
     || { tail -30 "$W/configure.log" >&2; say "configure failed: $W/configure.log"; exit 1; }
fi

say "make hotspot JOBS=$JOBS (clean: 10-17 min on 2 cores; incremental: seconds)"
OBJS=$S/build/release/hotspot/variant-server/libjvm/objs
( while sleep 30; do   # progress: libjvm has about 1070 objects
    n=$({ find "$OBJS" -maxdepth 1 -name '*.o' -newer "$W/.make-start" 2>/dev/null || true; } | wc -l)
    say "make hotspot: $n objects (re)compiled so far"
  done ) &
TICK=$!
touch "$W/.make-start"
set +e
make -C "$S" CONF=release hotspot JOBS="$JOBS" LOG=warn >"$W/make.log" 2>&1
rc=$?; set -e
kill "$TICK" 2>/dev/null; wait "$TICK" 2>/dev/null || true
if [ "$rc" != 0 ]; then
  grep -E -B2 -A6 'error|Error' "$W/make.log" | head -60 >&2; say "make hotspot failed ($W/make.log)"; exit 1
fi
say "make hotspot: done ($(find "$OBJS" -maxdepth 1 -name '*.o' -newer "$W/.make-start" | wc -l) objects recompiled)"

# --- assemble: same-version Debian JDK (variant B) + the patched libjvm.so + fresh CDS ---------
say "assembling the JDK"
TMP=$OUT.tmp; rm -rf "$TMP"; mkdir -p "$TMP/root"
for d in "$W"/dl/openjdk-17-j{re,dk}-headless_*_amd64.deb; do dpkg-deb -x "$d" "$TMP/root"; done
mv "$TMP/root/usr/lib/jvm/java-17-openjdk-amd64" "$TMP/jdk"
mv "$TMP/root/etc/java-17-openjdk" "$TMP/jdk/etc-java"; rm -rf "$TMP/root"
find "$TMP/jdk" -type l -lname '/etc/java-17-openjdk/*' | while read -r l; do
  t=$(readlink "$l")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$TMP/jdk/etc-java/${t#/etc/java-17-openjdk/}")" "$l"
done
install -m644 "$S/build/release/support/modules_libs/java.base/server/libjvm.so" "$TMP/jdk/lib/server/"
rm -f "$TMP"/jdk/lib/server/classes*.jsa
say "regenerating CDS archives"
"$TMP/jdk/bin/java" -Xshare:dump >/dev/null
"$TMP/jdk/bin/java" -XX:-UseCompressedOops -Xshare:dump >/dev/null
"$TMP/jdk/bin/java" -XX:+UseG1GC -Xshare:on -version >&2
{ echo "deb_version=$DEB_VERSION"; echo "key=$KEY"; for p in "${P[@]}"; do echo "patch=$(basename "$p")"; done; } >"$TMP/farmem-jdk.info"
rm -rf "$OUT"; mv "$TMP" "$OUT"; touch "$OUT/.done"
ln -sfn "$OUT" "$CACHE/current"
say "done: $OUT/jdk"
echo "$OUT/jdk"
