#!/usr/bin/env bash
# The device tool sends the session's checkout (/work/main), not a helper's worktree: copy this
# worktree's sources into the checkout's ignored .gpuhost/<name>/ and name that path in `carry`.
#   bash dev/cuda/sync_to_gpuhost.sh [name]      (default: the branch name)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
main=$(git rev-parse --path-format=absolute --git-common-dir)/..
name=${1:-$(git rev-parse --abbrev-ref HEAD)}
dest="$main/.gpuhost/$name"
rm -rf "$dest" && mkdir -p "$dest"
(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dest")
echo "$(git rev-parse --short HEAD)" > "$dest/.commit"
du -sh "$dest"
