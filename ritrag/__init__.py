"""ritrag shared core: record schemas, ids, the BM25 analyzer, the embedder loader and the index layout."""
