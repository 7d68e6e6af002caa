"""Whether two builds of the same input made the same index (issue #39's check).

Compares index directory A with index directory B, file by file, under the
relative paths both hold (a path only one holds is reported as such):

- a Parquet file (`.parquet`) by its table: `pq.read_table(a).equals(pq.read_table(b))`,
  so two writes of the same rows count as equal whatever their bytes (a
  writer's version string, row-group sizes) say;
- a manifest (`versions/*.json`) as JSON, less what differs from run to run:
  `created`, the `*_seconds` timings in `stats`, and the files' `sha256` and
  `bytes` in `segments` (a file whose bytes differ is reported with the files,
  where a Parquet file's bytes may differ and its table not);
- a serving-form file (`.arrays`, ritrag/serving_form.py) by its bytes, and
  where they differ array by array (name, dtype, shape, bytes), so the
  arrays that differ are named; a link array of the layout before node keys
  (the ids' bytes, S<w>) beside one of keys (uint64) is compared as keys
  (ritrag.ids.node_keys): "same links" when the two hold the same pairs;
- every other file by its bytes.

Run it, with ritrag importable, on two builds of one input, e.g. one made
by a wheel of an older commit and one by this checkout's (each `ritrag build
INPUT --out DIR --embedding_model hashing:384`, node-document vectors asked
for alike: --node_doc_vectors on, where the older commit embedded them):

    python benchmarks/build_identity.py OLD_INDEX NEW_INDEX [--json]

It prints one line per file (equal, or how it differs) and, for a manifest,
the JSON paths whose values differ with both values; it exits 0 when every
file is equal, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ritrag.ids import node_keys

# Manifest fields that differ between two runs of one build.
RUN_FIELDS = ("created",)
FILE_ENTRY_FIELDS = ("sha256", "bytes")  # a segment file's checksum, compared with the file itself


def relative_files(root: str) -> set[str]:
    """Every file under `root`, as a path relative to it."""
    return {os.path.relpath(os.path.join(folder, name), root)
            for folder, _, names in os.walk(root) for name in names}


def comparable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` less what differs from run to run (see the module's docstring)."""
    out = {k: v for k, v in manifest.items() if k not in RUN_FIELDS}
    out["stats"] = {k: v for k, v in manifest.get("stats", {}).items() if not k.endswith("_seconds")}
    out["segments"] = [{**segment, "files": {name: {k: v for k, v in entry.items() if k not in FILE_ENTRY_FIELDS}
                                             for name, entry in segment.get("files", {}).items()}}
                       for segment in manifest.get("segments", [])]
    return out


def json_differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(JSON path, value in a, value in b) of every leaf where `a` and `b` differ;
    a key only one holds has the value "<absent>" in the other."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b))
                for d in json_differences(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path or ".", a, b)]


def serving_arrays(data: bytes) -> dict[str, tuple[str, list[int], bytes]]:
    """The arrays of a serving-form file's bytes, by name: (dtype, shape, bytes),
    read by the container's layout (ritrag/serving_form.py's docstring) alone,
    so a file of an older layout reads too."""
    (length,) = struct.unpack("<Q", data[8:16])
    out = {}
    for name, spec in json.loads(data[16:16 + length])["arrays"].items():
        count = 1
        for n in spec["shape"]:
            count *= n
        width = int("".join(c for c in spec["dtype"] if c.isdigit()) or 1)  # "<i8", "|S17": bytes per item
        out[name] = (spec["dtype"], spec["shape"], data[spec["offset"]:spec["offset"] + count * width])
    return out


def _array_difference(a: tuple | None, b: tuple | None) -> str:
    """How serving arrays `a` and `b` (`serving_arrays`' values; None: absent) differ."""
    if a is None or b is None:
        return "only in " + ("B" if a is None else "A")
    (dtype_a, _, data_a), (dtype_b, _, data_b) = a, b
    keyed = {dtype_a[1], dtype_b[1]} == {"S", "u"}
    if keyed:
        ids, keys = (a, b) if dtype_a[1] == "S" else (b, a)
        same = np.array_equal(node_keys(np.frombuffer(ids[2], ids[0])), np.frombuffer(keys[2], keys[0]))
        return f"{dtype_a} -> {dtype_b}: {'same links' if same else 'OTHER LINKS'} as node keys"
    return f"{dtype_a} -> {dtype_b}: other values"


def compare_file(a: str, b: str, name: str) -> dict[str, Any]:
    """How file `name` of A (at `a`) compares with B's (at `b`): {"file", "how", "equal", ...}."""
    if name.endswith(".parquet"):
        table_a, table_b = pq.read_table(a), pq.read_table(b)
        equal = table_a.equals(table_b)
        result = {"file": name, "how": "parquet table", "equal": equal}
        if not equal:
            result["rows"] = [table_a.num_rows, table_b.num_rows]
            result["schema_equal"] = table_a.schema.equals(table_b.schema)
            if result["schema_equal"] and table_a.num_rows == table_b.num_rows:
                result["columns_differing"] = [column for column in table_a.column_names
                                               if not table_a[column].equals(table_b[column])]
        return result
    with open(a, "rb") as fa, open(b, "rb") as fb:
        data_a, data_b = fa.read(), fb.read()
    if name.startswith("versions" + os.sep) and name.endswith(".json"):
        differences = json_differences(comparable_manifest(json.loads(data_a)), comparable_manifest(json.loads(data_b)))
        return {"file": name, "how": "manifest, less run fields", "equal": not differences,
                **({"differences": [{"path": p, "a": x, "b": y} for p, x, y in differences]} if differences else {})}
    result = {"file": name, "how": "bytes", "equal": data_a == data_b}
    if data_a != data_b:
        result["bytes"] = [len(data_a), len(data_b)]
        if name.endswith(".arrays"):
            arrays_a, arrays_b = serving_arrays(data_a), serving_arrays(data_b)
            result["arrays_differing"] = {
                array: _array_difference(arrays_a.get(array), arrays_b.get(array))
                for array in sorted(set(arrays_a) | set(arrays_b)) if arrays_a.get(array) != arrays_b.get(array)}
    return result


def compare_indexes(a: str, b: str) -> list[dict[str, Any]]:
    """Every file's comparison (`compare_file`), and each file only one index holds."""
    files_a, files_b = relative_files(a), relative_files(b)
    results = [compare_file(os.path.join(a, name), os.path.join(b, name), name)
               for name in sorted(files_a & files_b)]
    results += [{"file": name, "how": "only in A", "equal": False} for name in sorted(files_a - files_b)]
    results += [{"file": name, "how": "only in B", "equal": False} for name in sorted(files_b - files_a)]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="index directory A")
    parser.add_argument("b", help="index directory B")
    parser.add_argument("--json", action="store_true", help="print the comparisons as one JSON list")
    args = parser.parse_args(argv)
    results = compare_indexes(args.a, args.b)
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        for r in results:
            print(f"{'equal    ' if r['equal'] else 'DIFFERENT'} {r['file']} ({r['how']})")
            for d in r.get("differences", []):
                print(f"    {d['path']}: {json.dumps(d['a'], default=str)[:200]} -> "
                      f"{json.dumps(d['b'], default=str)[:200]}")
            for key in ("rows", "schema_equal", "columns_differing", "bytes", "arrays_differing"):
                if key in r:
                    print(f"    {key}: {r[key]}")
        print(f"{sum(r['equal'] for r in results)} of {len(results)} files equal")
    return 0 if all(r["equal"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
