#!/usr/bin/env bash
# Full build on Apache Spark through Beam's portable Spark runner (a Spark job
# server in front of the cluster; the SDK harness as a container per executor).
#   SPARK_MASTER=spark://spark-master:7077 INPUT='hdfs:///crawl/**' infra/runners/spark.sh --site_depth 1
# JOB=crawl and JOB=refresh run the crawl and the scheduled loop (infra/runners/cluster_job.sh).
set -euo pipefail
: "${SPARK_MASTER:?}"
runner=(
  --runner SparkRunner --spark_master_url "$SPARK_MASTER"
  --environment_type "${ENVIRONMENT_TYPE:-DOCKER}"
  --environment_config "${SDK_IMAGE:-ritrag-worker:latest}"
)
source "$(dirname "$0")/cluster_job.sh"
