#!/usr/bin/env bash
# Builds the `cuda` binary of each given commit, stripped and gzipped, into gpu/<name>.gz — the A and B
# sides of scripts/gpu-ab.sh, which a session needs again whenever its checkout is new (gpu/ is not
# committed: list it in .git/info/exclude). A commit builds in a worktree under target/gpu-build, with
# its own cargo target folder there (kept between runs, so a rebuild is incremental) and this checkout's
# CUDA toolkit (target/cuda13, installed by ../shared/tools/cuda-build.sh on its first run).
#
#   bash scripts/gpu-build.sh f94e9da 89cce71 HEAD      # gpu/f94e9da.gz, gpu/89cce71.gz, gpu/HEAD.gz
#   bash scripts/gpu-build.sh a=f94e9da b=HEAD          # gpu/a.gz, gpu/b.gz
#
# HEAD (or any name of a commit) builds that commit, not the working tree's uncommitted changes.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
[ $# -gt 0 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
tool=$root/../shared/tools/cuda-build.sh
[ -f "$tool" ] || { echo "gpu-build: $tool not found" >&2; exit 1; }
mkdir -p gpu target/gpu-build
for spec in "$@"; do
    name=${spec%%=*} rev=${spec#*=}
    commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "gpu-build: no commit $rev" >&2; exit 2; }
    tree=target/gpu-build/tree
    git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
    git worktree prune
    git worktree add --detach --quiet "$tree" "$commit"
    echo "gpu-build: $name = $(git log -1 --format='%h %s' "$commit")" >&2
    # The worktree's .git is a file, so cuda-build.sh's `git rev-parse` finds the worktree's root.
    (cd "$tree" && CUDA_WHEELS_DIR=$root/target/cuda13 CARGO_TARGET_DIR=$root/target/gpu-build/target \
        bash "$tool")
    strip -o "target/gpu-build/esper-ecs" target/gpu-build/target/release/esper-ecs
    gzip -9 -c target/gpu-build/esper-ecs >"gpu/$name.gz"
    echo "$commit" >"gpu/$name.commit"
    echo "gpu-build: gpu/$name.gz ($(du -h "gpu/$name.gz" | cut -f1), commit ${commit:0:7})" >&2
    git worktree remove --force "$tree"
done
