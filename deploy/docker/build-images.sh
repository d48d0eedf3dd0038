#!/usr/bin/env bash
# Builds the Shardline images (deploy/docker/README.md) with no registry:
#
#   1. the project's .deb (cpack -G DEB in the build directory), unless --deb;
#   2. a Debian bookworm minbase root file system by debootstrap holding the
#      .deb's Depends (read from the package), cached as a tarball keyed by
#      suite, mirror and package list, and brought in by `docker import` as
#      shardline/base:<key>;
#   3. shardline/coordinator and shardline/worker (tags VERSION and latest) from
#      coordinator.Dockerfile and worker.Dockerfile: the .deb installed by dpkg,
#      the user shardline (uid and gid 10001), the program as ENTRYPOINT. The
#      worker image also carries the torch wheel's libraries (torch/lib and the
#      nvidia/* CUDA, cuDNN, NCCL libraries LibTorch loads) at
#      /usr/lib/shardline/site-packages, where the programs' RUNPATH looks.
#
#   deploy/docker/build-images.sh [--build DIR] [--deb FILE] [--site-packages DIR]
#                                 [--cache DIR] [--only coordinator|worker]
#
# Environment: DOCKER (the client command, default docker; DOCKER_HOST is
# honoured), DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SUITE
# (default bookworm: the build's libraries are bookworm's). Needs root for
# debootstrap (only when the rootfs is not cached), dpkg-deb, and a dockerd.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$root/build"
deb=""
site=""
only=""
cache="${XDG_CACHE_HOME:-$HOME/.cache}/shardline/docker"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --deb) deb="$2"; shift 2 ;;
    --site-packages) site="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in ""|coordinator|worker) ;; *) echo "build-images.sh: --only coordinator|worker" >&2; exit 2 ;; esac
read -r -a docker <<< "${DOCKER:-docker}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite="${DEBIAN_SUITE:-bookworm}"
# The classic builder: plain Dockerfiles need nothing more, and it needs no
# buildx plugin.
export DOCKER_BUILDKIT=0
say() { echo "build-images: $*"; }

work="$(mktemp -d "${TMPDIR:-/var/tmp}/shardline-images.XXXXXX")"
trap 'rm -rf --one-file-system "$work"' EXIT  # never into a mount a stopped debootstrap left

# --- 1. the package -------------------------------------------------------------
if [ -z "$deb" ]; then
  [ -f "$build/CPackConfig.cmake" ] || { echo "build-images.sh: no $build/CPackConfig.cmake (configure and build first, or pass --deb)" >&2; exit 1; }
  say "cpack -G DEB in $build"
  (cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1) \
    || { cat "$work/cpack.log" >&2; exit 1; }
  deb="$(ls "$work"/pkg/shardline_*.deb)"
fi
version="$(dpkg-deb -f "$deb" Version)"
revision="$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
# Depends as package names: "libc6 (>= 2.34), libgrpc++1.51 (>= 1.51.1)" -> libc6 libgrpc++1.51
mapfile -t depends < <(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/|.*//; s/[[:space:]]//g' | grep . | sort -u)
say "shardline $version ($revision), Depends: ${depends[*]}"

# --- 2. the base image ------------------------------------------------------------
recipe="suite=$suite mirror=$mirror variant=minbase include=$(IFS=,; echo "${depends[*]}") recipe=1"
key="$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"
rootfs="$cache/rootfs-$suite-$key.tar"
base="shardline/base:$suite-$key"
if ! "${docker[@]}" image inspect "$base" >/dev/null 2>&1; then
  if [ ! -f "$rootfs" ]; then
    say "debootstrap $suite (minbase + Depends) from $mirror; cached as $rootfs"
    mkdir -p "$cache"
    tree="$work/rootfs"
    debootstrap --variant=minbase --include="$(IFS=,; echo "${depends[*]}")" "$suite" "$tree" "$mirror" \
      >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
    # What an image needs of it: no package cache, no lists, no logs.
    rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/* "$tree"/var/log/* \
      "$tree"/tmp/* "$tree"/var/tmp/*
    echo "$recipe" > "$tree/etc/shardline-base-recipe"
    tar --numeric-owner --xattrs -C "$tree" -cf "$rootfs.part.$$" .
    mv "$rootfs.part.$$" "$rootfs"  # atomic: a run that stops halfway leaves no tarball
    rm -rf "$tree"
  fi
  say "docker import $rootfs as $base"
  "${docker[@]}" import --message "debootstrap --variant=minbase $suite: $recipe" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' "$rootfs" "$base" >/dev/null
fi

build_image() {  # name, context dir
  local name="$1" ctx="$2"
  cp "$here/$name.Dockerfile" "$ctx/Dockerfile"
  cp "$deb" "$ctx/shardline.deb"
  say "docker build shardline/$name:$version"
  "${docker[@]}" build --quiet --network none --build-arg "BASE=$base" --build-arg "VERSION=$version" \
    --build-arg "REVISION=$revision" -t "shardline/$name:$version" -t "shardline/$name:latest" "$ctx" >/dev/null
}

# --- 3. the images ------------------------------------------------------------------
if [ "$only" != worker ]; then
  mkdir -p "$work/coordinator"
  build_image coordinator "$work/coordinator"
fi
if [ "$only" != coordinator ]; then
  if [ -z "$site" ]; then
    # The wheel the build linked (SHARDLINE_LIBTORCH_DIR is its torch/lib).
    libtorch="$(sed -n 's/^SHARDLINE_LIBTORCH_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
    [ -n "$libtorch" ] || { echo "build-images.sh: no SHARDLINE_LIBTORCH_DIR in $build/CMakeCache.txt (pass --site-packages)" >&2; exit 1; }
    site="$(cd "$libtorch/../.." && pwd)"
  fi
  [ -f "$site/torch/lib/libtorch_cpu.so" ] || { echo "build-images.sh: no torch/lib/libtorch_cpu.so under $site" >&2; exit 1; }
  ctx="$work/worker"
  mkdir -p "$ctx/site-packages"
  # What the worker loads, by file: LibTorch's libraries (not the Python
  # binding), and the libraries libtorch_cuda.so and what it loads need
  # (readelf -d: cu13's runtime, cuBLAS, cuFFT, cuRAND, cuSPARSE with
  # nvJitLink, cuFile, CUPTI; cuSOLVER for libtorch_cuda_linalg; NVRTC for
  # libcaffe2_nvrtc; cuDNN, cuSPARSELt, NCCL, NVSHMEM). Left out: static
  # archives, headers, NVSHMEM's device bitcode, and what nothing loads
  # (cuSOLVERMg, NVBLAS, cuFFTW, the .alt NVRTC, the profiler's nvperf and
  # pcsampling, libcheckpoint): about 330 MB.
  stage() {  # relative dir, then find(1) filters
    local dir="$1"; shift
    [ -d "$site/$dir" ] || return 0
    mkdir -p "$ctx/site-packages/$dir"
    (cd "$site/$dir" && find . -maxdepth 1 \( -type f -o -type l \) -name '*.so*' "$@" -print0) |
      while IFS= read -r -d '' f; do
        # Hard links where the file system allows (no copy), else a copy.
        ln "$site/$dir/$f" "$ctx/site-packages/$dir/$f" 2>/dev/null || cp -a "$site/$dir/$f" "$ctx/site-packages/$dir/$f"
      done
  }
  stage torch/lib ! -name 'libtorch_python.so'
  stage nvidia/cu13/lib ! -name 'libcusolverMg.so*' ! -name 'libnvblas.so*' ! -name 'libcufftw.so*' \
    ! -name '*.alt.so*' ! -name 'libnvperf_*' ! -name 'libpcsamplingutil.so' ! -name 'libcheckpoint.so'
  for d in cudnn cusparselt nccl nvshmem; do stage "nvidia/$d/lib"; done
  [ -d "$ctx/site-packages/nvidia" ] || say "warning: $site has no nvidia/ libraries (a CPU-only torch): the worker image runs CPU ranks only"
  say "worker libraries: $(du -sh "$ctx/site-packages" | cut -f1) from $site"
  build_image worker "$ctx"
fi
"${docker[@]}" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep "^shardline/.*:$version " || true
