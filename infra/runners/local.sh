#!/usr/bin/env bash
# Full build on this machine with Beam's in-process runner using several worker
# processes (each holds its share of the shuffled collections in RAM: small and
# medium corpora only).
#   infra/runners/local.sh INPUT_DIR INDEX_DIR [build options]
# The crawl, and the scheduled loop (crawl -> update, or build the first time -> publish):
#   JOB=crawl   infra/runners/local.sh SEEDS_FILE CRAWL_DIR [crawl options]
#   JOB=refresh infra/runners/local.sh SEEDS_FILE CRAWL_DIR INDEX_DIR [crawl and build options]
set -euo pipefail
runner=(--runner FnApiRunner --direct_running_mode multi_processing --direct_num_workers "${WORKERS:-$(nproc)}")
case "${JOB:-build}" in
  crawl)   exec python -m ritrag.pipelines.crawl "${runner[@]}" --seeds "$1" --out "$2" "${@:3}" ;;
  refresh) exec python -m ritrag.pipelines.refresh "${runner[@]}" --embed_cpu_threads 1 \
             --seeds "$1" --crawl_dir "$2" --index "$3" "${@:4}" ;;
esac
input=$1; index=$2; shift 2
exec python -m ritrag.pipelines.build "${runner[@]}" --embed_cpu_threads 1 --input "$input" --out "$index" "$@"
