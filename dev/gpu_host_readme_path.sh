#!/usr/bin/env bash
# On the GPU host, from the repository root: the README's first command as a user runs it (doctor, train, the
# quickstart sweep, compare), then eval of the trained checkpoint twice (progress on stderr, the same JSON twice).
# Ray and MLflow come from a site bundle (../shared/tools/gpu_host_bundle.py .gpuhost/site.tar.xz, carried along).
#   bash dev/gpu_host_readme_path.sh [SITE_TAR_XZ]       (default .gpuhost/site.tar.xz)
set -u
site=${1:-.gpuhost/site.tar.xz}
mkdir -p /tmp/site && tar xJf "$site" -C /tmp/site && export PYTHONPATH=/tmp/site
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
python3 -c "import pvm_dist._native" 2>/dev/null || python3 -m pip install --no-build-isolation --no-deps -q . > /tmp/readme-build.log 2>&1 \
    || tail -20 /tmp/readme-build.log
rm -rf runs mlflow.db pvm-sweeps
s=$(date +%s); timeout 120 pvm-dist doctor 2>&1 | tail -15; echo "doctor $(( $(date +%s) - s )) s"
s=$(date +%s); timeout 150 pvm-dist train 2>&1 | tail -12; echo "train $(( $(date +%s) - s )) s"
s=$(date +%s); timeout 150 pvm-dist sweep run experiments/quickstart.yaml 2>&1 | tail -10; echo "sweep $(( $(date +%s) - s )) s"
timeout 60 pvm-dist compare quickstart 2>&1 | tail -8
ck=$(ls runs/*/checkpoints/*.pvmckpt 2>/dev/null | tail -1)
[ -n "$ck" ] || exit 1
for i in 1 2; do
    s=$(date +%s); timeout 120 pvm-dist eval "$ck" --steps 400000 --n-seq 8 --json > "/tmp/eval$i.json" 2> "/tmp/eval$i.err"
    echo "eval $i: rc $? in $(( $(date +%s) - s )) s"; tail -2 "/tmp/eval$i.err"
done
cmp -s /tmp/eval1.json /tmp/eval2.json && echo "eval twice: the same JSON" || echo "eval twice: DIFFERENT JSON"
