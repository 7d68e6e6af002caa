"""Model metadata: a summary and keywords per node, and a table of contents
for long PDFs without one, from a chat model (docs/METADATA.md). `base` is the
contract (the versioned prompt, the answer's checks, the cache key, the
`NodeMetadataModel` protocol), `openai_compatible` the one backend, `cache` the
content-keyed records, `enrich` the stage `EnrichNodeMetadata` and its flags
(`MetadataOptions`), `toc` the PDF ToC's contract (windows, prompt, answer,
verification) and `induce_toc` its stage `InduceTocFromModel`."""
