#!/usr/bin/env bash
# On a development machine (Debian 12, with apt): downloads the Debian
# packages that the GPU build needs beyond what a GPU machine has (CUDA with
# nvcc and a host compiler, python3 with torch 2.11 and the NCCL wheel, CMake,
# ninja; no Debian -dev packages), with the libraries they load, so that they
# travel with the tree to a machine without a registry (64 MiB in all;
# tests/gpu/carry_size_test.sh fails above 48 MiB).
#   tests/gpu/fetch-debs.sh [DIR]    DIR: $SHARDLINE_GPU_DEBS, else .gpu-debs/ (git ignores it)
# then, on the GPU machine: tests/gpu/run.sh build (README "GPU machines").
#
# The list is the GPU build's own, not tests/deps.sh's (which also installs
# the deploy tests' docker.io, slurm, systemd, clang...): what the configure
# looks for (find_package, pkg_check_modules, find_path, find_program in
# CMakeLists.txt, proto/ and common/) and what the targets of the `gpu` tests
# (nccl_test, shardline-train, shardline-worker, shardline-coordinator,
# shardctl) include and link.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${1:-${SHARDLINE_GPU_DEBS:-$root/.gpu-debs}}"

# With everything they depend on (less the base below).
packages=(
  libgrpc++-dev protobuf-compiler-grpc   # gRPC::grpc++ (+ c-ares, re2, OpenSSL), grpc_cpp_plugin
  libprotobuf-dev protobuf-compiler      # protobuf::libprotobuf, protoc
  libabsl-dev                            # absl::status, strings, synchronization...
  libssl-dev zlib1g-dev                  # OpenSSL::Crypto; ZLIB for gRPC's and prometheus-cpp's configs
  libsqlite3-dev                         # pkg_check_modules(sqlite3): the coordinator's state
  libgtest-dev                           # GTest::gtest (nccl_test); gmock is not used
  prometheus-cpp-dev libmicrohttpd-dev   # shardline_metrics (worker, coordinator); pulls curl for its config
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev  # headers
  pkgconf                                # pkg_check_modules needs a pkg-config
)
# Alone: Gloo's headers, for torch's ProcessGroupGloo.hpp. Its shared library
# is never linked (libtorch_cpu holds Gloo), nor its ibverbs and redis
# transports, whose packages would drag in adduser, passwd and PAM.
alone=(libgloo-dev)

# What every GPU machine has in its own (newer) version, and what the closure
# drags in but the build never runs: the C runtime, the compilers and binutils
# and what they load, perl, dpkg. zlib1g stays: zlib1g-dev's libz.so points at it.
base='^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|libstdc\+\+6|libstdc\+\+-12-dev|gcc-12-base|gcc.*|g\+\+.*|cpp.*|libgcc-12-dev|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl2|libnsl-dev|libtirpc.*|rpcsvc-proto|libzstd1|perl.*|libperl.*|debconf.*|dpkg|tar|libselinux1|libpcre2.*|libgomp1|libitm1|libatomic1|libasan8|liblsan0|libtsan2|libubsan1|libquadmath0|libcc1-0|libisl23|libmpc3|libmpfr6|libgmp10|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libsframe0|libdb5.3|libgdbm.*|libbz2-1.0|liblzma5|libmd0|libbsd0|libhogweed6|libnettle8|libgnutls30|libidn2-0|libunistring2|libp11-kit0|libtasn1-6|libffi8|libc-bin|sensible-utils|awk|mawk|base-files|bash|coreutils|init-system-helpers)$'

apt_opts=(-o APT::Sandbox::User="$(id -un)")
fetch() {
  local closure wanted
  closure=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${packages[@]}" | grep -E '^[a-z0-9]' | sort -u | grep -Ev "$base") || return
  mapfile -t wanted < <(printf '%s\n' "$closure" "${alone[@]}" | sort -u)
  rm -rf "$dir" && mkdir -p "$dir" || return
  (cd "$dir" && apt-get "${apt_opts[@]}" download "${wanted[@]}" >/dev/null)
}
if ! fetch; then
  # Stale package lists name versions the mirror no longer has: read fresh
  # ones into a scratch folder (no root needed) and try once more.
  echo "fetch-debs.sh: apt-get download failed; again with fresh package lists of its own" >&2
  lists="$(mktemp -d)"
  trap 'rm -rf "$lists"' EXIT
  mkdir -p "$lists/partial"
  apt_opts+=(-o Dir::State::Lists="$lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
  apt-get -qq "${apt_opts[@]}" update
  if ! fetch; then
    echo "fetch-debs.sh: apt-get download failed" >&2
    exit 1
  fi
fi

# Every file the configure and the gpu targets look for must be in the set.
need=(usr/bin/protoc usr/bin/grpc_cpp_plugin usr/bin/pkgconf
  usr/lib/x86_64-linux-gnu/cmake/grpc/gRPCConfig.cmake usr/lib/x86_64-linux-gnu/cmake/absl/abslConfig.cmake
  usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake usr/lib/x86_64-linux-gnu/libgtest.a
  usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake
  usr/lib/x86_64-linux-gnu/cmake/civetweb/civetweb-config.cmake
  usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake usr/lib/x86_64-linux-gnu/pkgconfig/sqlite3.pc
  usr/lib/x86_64-linux-gnu/libprotobuf.so usr/lib/x86_64-linux-gnu/libcrypto.so usr/lib/x86_64-linux-gnu/libz.so
  usr/lib/x86_64-linux-gnu/libcurl.so usr/include/gloo/context.h usr/include/toml++/toml.h usr/include/CLI/CLI.hpp
  usr/include/openssl/ssl.h usr/include/google/protobuf/message.h usr/include/zlib.h usr/include/x86_64-linux-gnu/curl/curl.h
  usr/include/x86_64-linux-gnu/openssl/configuration.h)
contents=$(for f in "$dir"/*.deb; do dpkg-deb -c "$f"; done | awk '{print $6}' | sed 's|^\./||')
missing=()
for p in "${need[@]}"; do grep -qxF "$p" <<<"$contents" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "fetch-debs.sh: the packages lack what the build needs: ${missing[*]}" >&2
  exit 1
fi

n=$(find "$dir" -name '*.deb' | wc -l)
bytes=$(find "$dir" -name '*.deb' -printf '%s\n' | awk '{t += $1} END {print t}')
echo "$dir: $n debs, $bytes bytes ($(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB); largest:"
find "$dir" -name '*.deb' -printf '%s %f\n' | sort -rn | head -5 |
  awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
