# Sourced by the cluster runner scripts (flink.sh, spark.sh) once they have set the
# array `runner` (their runner flags): runs the job JOB names (build by default).
#   JOB=build   INPUT=...                                  full build into INDEX
#   JOB=crawl   SEEDS=seeds.txt CRAWL_DIR=/mnt/crawl       the crawl (docs/CRAWL.md)
#   JOB=refresh SEEDS=seeds.txt CRAWL_DIR=/mnt/crawl       crawl -> update (or build the first time) -> publish
# CRAWL_DIR must be a volume the launcher and every worker mount (docs/CRAWL.md).
case "${JOB:-build}" in
  crawl)   : "${SEEDS:?}" "${CRAWL_DIR:?}"
           exec python -m ritrag.pipelines.crawl "${runner[@]}" --seeds "$SEEDS" --out "$CRAWL_DIR" \
             --warc_shards "${NUM_SHARDS:-32}" "$@" ;;
  refresh) : "${SEEDS:?}" "${CRAWL_DIR:?}"
           exec python -m ritrag.pipelines.refresh "${runner[@]}" --seeds "$SEEDS" --crawl_dir "$CRAWL_DIR" \
             --index "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" --warc_shards "${NUM_SHARDS:-32}" "$@" ;;
  build)   : "${INPUT:?}"
           exec python -m ritrag.pipelines.build "${runner[@]}" \
             --input "$INPUT" --out "${INDEX:-/mnt/index}" --num_shards "${NUM_SHARDS:-32}" "$@" ;;
  *)       echo "JOB must be build, crawl or refresh, not ${JOB}" >&2; exit 2 ;;
esac
