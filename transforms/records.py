"""Beam's coder of the typed table records (ritrag.schema.NodeRow, ChunkRow,
and the records of the live rows the update reads back in part).

Registered when this module is imported, by every module that declares them
as element types: Beam's RowCoder then encodes a record field by field where a
shuffle or a runner boundary needs it (its default coder would pickle each
one). ritrag.schema itself does not import Beam: the server reads it too.
"""
from __future__ import annotations

import apache_beam as beam

from ritrag.schema import ChunkRef, ChunkRow, NodeRow, NodeSkeleton, PageLinks, StoredSkeleton, StoredTarget

for _record in (NodeRow, ChunkRow, ChunkRef, NodeSkeleton, StoredTarget, StoredSkeleton, PageLinks):
    beam.coders.registry.register_row(_record)
