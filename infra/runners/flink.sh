#!/usr/bin/env bash
# Full build on an Apache Flink cluster through Beam's portable Flink runner.
# The SDK harness runs as a Docker container per task manager (or use
# --environment_type=PROCESS with the project installed on every task manager).
#   FLINK_MASTER=flink-jobmanager:8081 INPUT='s3://bucket/crawl/**' infra/runners/flink.sh --site_depth 1
# JOB=crawl and JOB=refresh run the crawl and the scheduled loop (infra/runners/cluster_job.sh).
set -euo pipefail
: "${FLINK_MASTER:?}"
runner=(
  --runner FlinkRunner --flink_master "$FLINK_MASTER"
  --environment_type "${ENVIRONMENT_TYPE:-DOCKER}"
  --environment_config "${SDK_IMAGE:-ritrag-worker:latest}"
  --parallelism "${PARALLELISM:-32}"
)
source "$(dirname "$0")/cluster_job.sh"
