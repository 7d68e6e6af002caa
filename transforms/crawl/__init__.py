"""The crawler (`ritrag crawl`, pipelines/crawl.py): Scrapy's concepts, one
module each; the Nutch-style rounds between them are Beam transforms.

- `scope`       which URLs a crawl may fetch, and the one spelling of each (`clean_url`, `crawl_key`)
- `robots`      robots.txt policy (protego)
- `sitemaps`    sitemaps and sitemap indexes (lxml, gzip)
- `links`       a fetched page's links and canonical, for discovery
- `downloader`  one GET as a crawler does it: retries, Retry-After, size cap, deadline (httpx)
- `round`       one fetch round: a host's URLs through one politeness gate, a shard's bodies stored
- `crawldb`     the targets of a round, the CrawlDB rows it writes, `Generate` and `UpdateCrawlDb`
- `warc_writer` the WARC files a crawl keeps the bodies in

What a crawl leaves (a crawl directory: ritrag.crawl_dir) is read back by the
build's input side (ritrag.transforms.sources.warc), which imports nothing from
here: only the crawl and refresh jobs do (tests/test_boundaries.py).
"""
