#!/usr/bin/env bash
# Full build on an Apache Flink cluster through Beam's portable Flink runner.
# The SDK harness runs as a Docker container per task manager (or use
# --environment_type=PROCESS with the project installed on every task manager).
#   FLINK_MASTER=flink-jobmanager:8081 INPUT='s3://bucket/crawl/**' infra/runners/flink.sh --site_depth 1
set -euo pipefail
: "${FLINK_MASTER:?}" "${INPUT:?}"
exec python -m pipelines.build \
  --runner FlinkRunner --flink_master "$FLINK_MASTER" \
  --environment_type "${ENVIRONMENT_TYPE:-DOCKER}" \
  --environment_config "${SDK_IMAGE:-ritrag-worker:latest}" \
  --parallelism "${PARALLELISM:-32}" \
  --input "$INPUT" --out "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" "$@"
