"""Adapting an index's embedder to its own corpus (`ritrag adapt`): training
pairs sampled from the index's forest (`pairs`), a fine-tune with in-batch and
hard negatives saved as a sentence-transformers folder with its checksum
(`train`). A build with `--embedding_model FOLDER` re-embeds with it and
records the folder and checksum in the manifest; the server refuses the index
when the folder is missing or changed (ritrag/embedder.py, `check_model_files`)."""
from ritrag.adaptation.train import AdaptConfig, AdaptError, adapt

__all__ = ["AdaptConfig", "AdaptError", "adapt"]
