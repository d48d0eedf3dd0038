#!/usr/bin/env bash
# On a development machine (Debian 12, with apt): downloads the Debian
# packages the build needs beyond what a GPU machine has (CUDA, PyTorch,
# CMake, ninja), with the libraries they load, into .gpu-debs/ (git ignores
# it), so that they travel with the tree to a machine without a registry.
#   tests/gpu/fetch-debs.sh            then: device run with carry [".gpu-debs"]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="$root/.gpu-debs"
# shellcheck source=tests/deps.sh
source "$root/tests/deps.sh"
# The build's -dev packages (tests/deps.sh) less the toolchain, Python and
# Prometheus, which the GPU machine has or the gpu tests do not use.
wanted=()
for p in "${SHARDLINE_APT_PACKAGES[@]}"; do
  case "$p" in build-essential|cmake|ninja-build|python3-venv|prometheus|openssl) ;; *) wanted+=("$p") ;; esac
done
# What every target machine has in a newer version, and what the closure
# drags in but the build never runs (compilers, perl).
base='^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|libstdc\+\+6|libstdc\+\+-12-dev|gcc-12-base|gcc.*|g\+\+.*|cpp.*|libgcc-12-dev|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl2|libnsl-dev|libtirpc.*|rpcsvc-proto|zlib1g|libzstd1|perl.*|libperl.*|debconf.*|dpkg|tar|libselinux1|libpcre2.*|libgomp1|libitm1|libatomic1|libasan8|liblsan0|libtsan2|libubsan1|libquadmath0|libcc1-0|libisl23|libmpc3|libmpfr6|libgmp10|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libsframe0|libdb5.3|libgdbm.*|libbz2-1.0|liblzma5|libmd0|libbsd0|libhogweed6|libnettle8|libgnutls30|libidn2-0|libunistring2|libp11-kit0|libtasn1-6|libffi8|libc-bin|sensible-utils|awk|mawk|base-files|bash|coreutils|init-system-helpers)$'
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances "${wanted[@]}" pkgconf | grep -E '^[a-z0-9]' | sort -u | grep -Ev "$base")
rm -rf "$dir" && mkdir -p "$dir"
(cd "$dir" && apt-get download $closure >/dev/null)
du -sh "$dir"
