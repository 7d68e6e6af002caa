"""Node and chunk rows are typed records made from their tables' schemas
(ritrag.schema.table_record): the record and the schema cannot disagree, and
the table sink writes the same Arrow columns from records as from dicts."""
from typing import Optional, Sequence

import pyarrow as pa

from ritrag.schema import CHUNKS_SCHEMA, NODES_SCHEMA, TABLES, ChunkRow, NodeRow
from ritrag.transforms.tables import dicts_table, records_table
from support import chunk_row, node_row


def test_the_records_hold_the_schemas_columns_in_order():
    assert NodeRow._fields == tuple(NODES_SCHEMA.names)
    # embedded_text is what the model embeds: in the pipeline, no column.
    assert ChunkRow._fields == (*CHUNKS_SCHEMA.names, "embedded_text")
    assert TABLES["nodes"].record is NodeRow and TABLES["chunks"].record is ChunkRow
    assert all(spec.record is None for kind, spec in TABLES.items() if kind not in ("nodes", "chunks"))


def test_the_records_field_types_follow_the_schemas():
    for record, schema in ((NodeRow, NODES_SCHEMA), (ChunkRow, CHUNKS_SCHEMA)):
        for field in schema:
            hint = record.__annotations__[field.name]
            base = (str if pa.types.is_string(field.type) else int if pa.types.is_integer(field.type)
                    else Sequence[str])
            assert hint == (Optional[base] if field.nullable else base), field


def test_records_become_the_table_that_dicts_of_the_same_rows_become():
    nodes = [node_row(node_id="a", ancestor_ids=["r"], ancestor_titles=["R"], keywords=["k"], url="u"),
             node_row(node_id="b", parent_id="a", page_id="b", body="text")]
    chunks = [chunk_row(chunk_id=2, text="x", embedded_text="path\nx"), chunk_row(chunk_id=1, ordinal=-2)]
    for rows, schema in ((nodes, NODES_SCHEMA), (chunks, CHUNKS_SCHEMA)):
        as_dicts = [{name: value for name, value in row._asdict().items() if name in schema.names} for row in rows]
        assert records_table(rows, schema).equals(dicts_table(as_dicts, schema))
        assert records_table([], schema).equals(dicts_table([], schema))
