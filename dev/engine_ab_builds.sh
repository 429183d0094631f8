#!/usr/bin/env bash
# A/B of two builds of the native engine, for changes no environment switch can select: BASE_TREE (another checkout of
# this repository, e.g. `git worktree add /tmp/base REF` or `git archive REF | tar -x -C /tmp/base`) against the
# engine installed in this environment (this tree: `pip install --no-build-isolation --no-deps .`).
#   bash dev/engine_ab_builds.sh BASE_TREE OUT_DIR [dev/engine_ab.py options: --specs, --n-seq, --steps, --frames]
# BASE_TREE is built into OUT_DIR/base-site (pip --target; CMAKE_ARGS as for any build). Each round runs
# dev/engine_ab.py once on the base build (PYTHONPATH) and once on this one, alternating, so that drift falls on both;
# then `engine_ab.py --summarize` prints each build's best against the base's. Environment: AB_ROUNDS (default 2);
# AB_VARIANTS, this build's variants as engine_ab.py takes them (default "this:"; e.g. "this: nowg:PVM_CUDA_WGMMA=0"
# to time one of this build's switches against the base build as well).
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash dev/engine_ab_builds.sh BASE_TREE OUT_DIR [engine_ab.py options]" >&2
    exit 2
fi
BASE=$1 OUT_DIR=$2
shift 2
if [ ! -f "$BASE/pyproject.toml" ] || [ ! -d "$BASE/native" ]; then
    echo "engine_ab_builds: $BASE is not a checkout of this repository (no pyproject.toml and native/)" >&2
    exit 2
fi
ROUNDS=${AB_ROUNDS:-2}
case $ROUNDS in '' | *[!0-9]* | 0) echo "engine_ab_builds: AB_ROUNDS must be a positive integer, not '$ROUNDS'" >&2; exit 2 ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT_DIR" || exit 2
rm -rf "$OUT_DIR/base-site" "$OUT_DIR"/base-*.json "$OUT_DIR"/this-*.json  # a summary of this run's rows only
echo "building $BASE into $OUT_DIR/base-site"
if ! python3 -m pip install --no-build-isolation --no-deps -q --target "$OUT_DIR/base-site" "$BASE" > "$OUT_DIR/base-build.log" 2>&1; then
    echo "engine_ab_builds: building $BASE failed (the log: $OUT_DIR/base-build.log)" >&2
    exit 1
fi
for r in $(seq 1 "$ROUNDS"); do
    PYTHONPATH="$OUT_DIR/base-site" python3 -P "$HERE/engine_ab.py" base: --rounds 1 --json "$OUT_DIR/base-$r.json" "$@" || exit 1
    # shellcheck disable=SC2086  # (variants split at spaces)
    python3 -P "$HERE/engine_ab.py" ${AB_VARIANTS:-this:} --rounds 1 --json "$OUT_DIR/this-$r.json" "$@" || exit 1
done
echo "summary (best of $ROUNDS rounds, against the base build)"
python3 -P "$HERE/engine_ab.py" --summarize "$OUT_DIR"/base-*.json "$OUT_DIR"/this-*.json
