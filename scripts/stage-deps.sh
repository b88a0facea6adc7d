#!/usr/bin/env bash
# Stages this machine's Debian builds of qdelta's library dependencies (jansson,
# pcre2, utf8proc, libmicrohttpd and the shared libraries it pulls in) into
# .deps/ (ignored by git), with relocatable pkg-config files. The GPU machine has
# none of these packages and no network; carrying .deps there lets the full CMake
# build configure and link:
#   PKG_CONFIG_PATH=$PWD/.deps/lib/pkgconfig LD_LIBRARY_PATH=$PWD/.deps/lib cmake ...
# The libraries need glibc >= 2.34 at run time. Also writes .deps.tar.xz (the same, compressed).
set -euo pipefail
cd "$(dirname "$0")/.."
D=.deps
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/pkgconfig"
ML=/usr/lib/x86_64-linux-gnu
for h in jansson.h jansson_config.h pcre2.h utf8proc.h microhttpd.h; do
    cp -L "/usr/include/$h" "$D/include/" 2>/dev/null || cp -L "$ML/../../include/$h" "$D/include/"
done
copy_lib() { # soname-less link name and the real file
    local f=$1 base
    base=$(basename "$f")
    cp -L "$f" "$D/lib/$base"
}
for l in libjansson.so.4 libpcre2-8.so.0 libutf8proc.so.2 libmicrohttpd.so.12; do
    copy_lib "$ML/$l"
    ln -sf "$l" "$D/lib/${l%%.so*}.so"
done
# the shared libraries libmicrohttpd needs beyond glibc
ldd "$ML/libmicrohttpd.so.12" | awk '$3 ~ /^\// {print $3}' | while read -r f; do
    case "$(basename "$f")" in libc.so*|libm.so*|libpthread.so*|libdl.so*|ld-linux*) continue ;; esac
    copy_lib "$f"
done
pc() { # name lib
    cat >"$D/lib/pkgconfig/$1.pc" <<PC
prefix=\${pcfiledir}/../..
Name: $1
Description: staged $1
Version: 0
Cflags: -I\${prefix}/include
Libs: -L\${prefix}/lib -l$2 -Wl,-rpath,\${prefix}/lib
PC
}
pc jansson jansson
pc libpcre2-8 pcre2-8
pc libutf8proc utf8proc
pc libmicrohttpd microhttpd
# the GPU machine's calls carry a size-limited tree: carry this archive (scripts/gpu-check.sh unpacks it)
tar -cJf .deps.tar.xz "$D"
du -sh "$D" .deps.tar.xz
