"""Model metadata: a summary and keywords per node, from a chat model
(docs/METADATA.md). `base` is the contract (the versioned prompt, the answer's
checks, the cache key, the `NodeMetadataModel` protocol), `openai_compatible`
the one backend, `cache` the content-keyed records, `enrich` the stage
`EnrichNodeMetadata` and its flags (`MetadataOptions`)."""
