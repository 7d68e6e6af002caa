#!/usr/bin/env bash
# Full build on Apache Spark through Beam's portable Spark runner (a Spark job
# server in front of the cluster; the SDK harness as a container per executor).
#   SPARK_MASTER=spark://spark-master:7077 INPUT='hdfs:///crawl/**' infra/runners/spark.sh --site_depth 1
set -euo pipefail
: "${SPARK_MASTER:?}" "${INPUT:?}"
exec python -m pipelines.build \
  --runner SparkRunner --spark_master_url "$SPARK_MASTER" \
  --environment_type "${ENVIRONMENT_TYPE:-DOCKER}" \
  --environment_config "${SDK_IMAGE:-ritrag-worker:latest}" \
  --input "$INPUT" --out "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" "$@"
