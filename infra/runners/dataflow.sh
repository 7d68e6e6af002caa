#!/usr/bin/env bash
# Full build on Google Cloud Dataflow. Workers install the project from setup.py;
# the embed step can go to GPU workers (docs/GPU.md), everything else stays on CPU.
#   PROJECT=my-proj REGION=europe-west1 BUCKET=gs://my-bucket INPUT='gs://my-bucket/crawl/**' \
#     infra/runners/dataflow.sh --base_url https://docs.example.com/ --site_depth 1
# No crawl line here: the crawl's launcher keeps its fetch lists and CrawlDB on a
# path it shares with the workers (docs/CRAWL.md), which Dataflow workers cannot
# mount; crawl with local.sh, flink.sh or spark.sh and build/update from the result.
set -euo pipefail
: "${PROJECT:?}" "${REGION:?}" "${BUCKET:?}" "${INPUT:?}"
INDEX=${INDEX:-/mnt/index}          # the launcher publishes here; mount shared storage for serving
exec python -m ritrag.pipelines.build \
  --runner DataflowRunner --project "$PROJECT" --region "$REGION" \
  --temp_location "$BUCKET/tmp" --staging_location "$BUCKET/staging" \
  --setup_file ./setup.py --experiments use_runner_v2 \
  --num_workers "${NUM_WORKERS:-32}" --max_num_workers "${MAX_WORKERS:-32}" \
  --machine_type "${MACHINE_TYPE:-n2-standard-8}" \
  --input "$INPUT" --out "$INDEX" --num_shards "${NUM_SHARDS:-32}" "$@"
