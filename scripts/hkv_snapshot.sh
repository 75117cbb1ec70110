#!/usr/bin/env bash
# Export NVIDIA HierarchicalKV (HKV) at a pinned commit into build/hkv_snapshot/ so that
# benchmarks/hkv/run_hkv.sh can build HKV's own benchmark on a machine without network.
#
#   bash scripts/hkv_snapshot.sh [DEST]     # DEST defaults to build/hkv_snapshot
#
# Source: $HKV_MIRROR (a git dir holding the commit; default the local bare mirror below),
# else a clone of https://github.com/NVIDIA-Merlin/HierarchicalKV. Only LICENSE, include/
# and benchmark/ are exported (< 1 MiB); the commit goes to DEST/COMMIT.
# $HKV_COMMIT overrides the pinned commit.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO_ROOT/build/hkv_snapshot}"
HKV_COMMIT="${HKV_COMMIT:-ae24eecde0b42a90b2c83db15eba0294b5cc2928}"
HKV_MIRROR="${HKV_MIRROR:-/work/.mirror/NVIDIA-Merlin+HierarchicalKV/repo}"
HKV_URL="${HKV_URL:-https://github.com/NVIDIA-Merlin/HierarchicalKV}"

tmp=""
cleanup() { [ -n "$tmp" ] && rm -rf "$tmp"; }
trap cleanup EXIT

if [ -d "$HKV_MIRROR" ] && git -C "$HKV_MIRROR" cat-file -e "${HKV_COMMIT}^{commit}" 2>/dev/null; then
  src="$HKV_MIRROR"
else
  echo "hkv_snapshot: no mirror with $HKV_COMMIT at $HKV_MIRROR; cloning $HKV_URL" >&2
  tmp="$(mktemp -d)"
  git clone --quiet --bare --filter=blob:none "$HKV_URL" "$tmp/hkv.git"
  src="$tmp/hkv.git"
fi

rm -rf "$DEST"
mkdir -p "$DEST"
git -C "$src" archive --format=tar "$HKV_COMMIT" LICENSE include benchmark | tar -x -C "$DEST"
echo "$HKV_COMMIT" > "$DEST/COMMIT"
echo "hkv_snapshot: HKV $HKV_COMMIT -> $DEST ($(du -sh "$DEST" | cut -f1))"
