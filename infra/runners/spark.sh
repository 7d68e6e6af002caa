#!/usr/bin/env bash
# Full build on Apache Spark through Beam's portable Spark runner (a Spark job
# server in front of the cluster; the SDK harness as a container per executor).
#   SPARK_MASTER=spark://spark-master:7077 INPUT='hdfs:///crawl/**' infra/runners/spark.sh --site_depth 1
# The crawl and the scheduled loop (crawl -> update, or build the first time -> publish),
# with CRAWL_DIR on a volume the launcher and every worker mount (docs/CRAWL.md):
#   JOB=crawl SEEDS=seeds.txt CRAWL_DIR=/mnt/crawl ... [crawl options]
#   JOB=refresh SEEDS=seeds.txt CRAWL_DIR=/mnt/crawl INDEX=/mnt/index ... [crawl and build options]
set -euo pipefail
: "${SPARK_MASTER:?}"
runner=(
  --runner SparkRunner --spark_master_url "$SPARK_MASTER"
  --environment_type "${ENVIRONMENT_TYPE:-DOCKER}"
  --environment_config "${SDK_IMAGE:-ritrag-worker:latest}"
)
case "${JOB:-build}" in
  crawl)   : "${SEEDS:?}" "${CRAWL_DIR:?}"
           exec python -m pipelines.crawl "${runner[@]}" --seeds "$SEEDS" --out "$CRAWL_DIR" \
             --warc_shards "${NUM_SHARDS:-32}" "$@" ;;
  refresh) : "${SEEDS:?}" "${CRAWL_DIR:?}"
           exec python -m pipelines.refresh "${runner[@]}" --seeds "$SEEDS" --crawl_dir "$CRAWL_DIR" \
             --index "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" --warc_shards "${NUM_SHARDS:-32}" "$@" ;;
esac
: "${INPUT:?}"
exec python -m pipelines.build "${runner[@]}" \
  --input "$INPUT" --out "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" "$@"
