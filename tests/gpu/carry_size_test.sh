#!/usr/bin/env bash
# What travels to a GPU machine must fit (ctest gpu_route_carry_size, label
# deploy; README "GPU machines"): the Debian packages tests/gpu/fetch-debs.sh
# downloads, fetched here into a scratch folder, plus the tree that travels
# with them (git's tracked files and the untracked ones it does not ignore),
# at most 48 MiB of the 64 MiB a device call takes, so that NCCL's source or
# wheels still fit beside them. Needs apt and a Debian mirror.
#   tests/gpu/carry_size_test.sh [LIMIT_MIB]     (default 48)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
limit_mib="${1:-48}"
limit=$((limit_mib * 1048576))
scratch="$(mktemp -d "${TMPDIR:-/tmp}/shardline-carry.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

"$root/tests/gpu/fetch-debs.sh" "$scratch/debs"
n_debs=$(find "$scratch/debs" -name '*.deb' | wc -l)
debs=$(find "$scratch/debs" -name '*.deb' -printf '%s\n' | awk '{t += $1} END {print t + 0}')
if [ "$n_debs" -lt 20 ]; then
  echo "FAIL fetch-debs.sh brought $n_debs packages: the build needs more" >&2
  exit 1
fi

if ! git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  echo "FAIL $root is not a git checkout: cannot tell which files travel" >&2
  exit 1
fi
cd "$root"
git ls-files -z --cached --others --exclude-standard >"$scratch/files"
xargs -0 -r stat -c '%s %n' <"$scratch/files" >"$scratch/tree" 2>/dev/null || true  # a deleted file has no size
tree=$(awk '{t += $1} END {print t + 0}' "$scratch/tree")
total=$((debs + tree))

echo "packages $(mib "$debs") ($n_debs debs) + tree $(mib "$tree") = $(mib "$total") (limit $limit_mib MiB)"
if [ "$total" -gt "$limit" ]; then
  {
    echo "FAIL what travels to a GPU machine, $(mib "$total"), passes $limit_mib MiB. Largest packages:"
    find "$scratch/debs" -name '*.deb' -printf '%s %f\n' | sort -rn | head -8 |
      awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
    echo "Largest files of the tree:"
    sort -rn "$scratch/tree" | head -5 | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
  } >&2
  exit 1
fi
echo "PASS what travels to a GPU machine fits: $(mib "$total") <= $limit_mib MiB"
