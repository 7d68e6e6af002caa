#!/usr/bin/env bash
# Full build on this machine with Beam's in-process runner using several worker
# processes (each holds its share of the shuffled collections in RAM: small and
# medium corpora only).
#   infra/runners/local.sh INPUT_DIR INDEX_DIR [build options]
set -euo pipefail
input=$1; index=$2; shift 2
exec python -m pipelines.build --runner FnApiRunner \
  --direct_running_mode multi_processing --direct_num_workers "${WORKERS:-$(nproc)}" \
  --embed_cpu_threads 1 \
  --input "$input" --out "$index" "$@"
