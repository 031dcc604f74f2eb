"""Compare report outputs: two output directories, or one with a stored fingerprint.

A change to the Spark job must leave its results alone; this checks that on any lake:

    python -m pipeline.compare OUT_A OUT_B [--rel 1e-12]
    python -m pipeline.compare --fingerprint OUT > fingerprint.json
    python -m pipeline.compare OUT --against fingerprint.json

Rows are matched after sorting, since Spark's row order within a table is not part of
the result.  Everything but floating-point values must be equal; floats must be within
``rel`` (0 by default: bit for bit).  Sums of doubles may differ in the last bits when
Spark adds partial sums in another order, hence the option.  A fingerprint is small
enough to keep in the repository: per table its columns, row count, a digest of every
non-float value and two sums per float column; plus summary.json.  pyarrow only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# "name type" of each column (non-floats first), the float columns, the sorted rows
Table = tuple[list[str], list[str], list[tuple]]


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def load_table(path: Path) -> Table:
    """A Spark output directory as (columns, float columns, rows sorted by every value)."""
    table = pq.read_table(path)
    types = {f.name: str(f.type) for f in table.schema}
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    exact = [c for c in table.column_names if c not in floats]
    order = exact + floats  # non-float values first, so float noise never reorders rows
    rows = [tuple(_plain(row[c]) for c in order) for row in table.to_pylist()]
    rows.sort(key=lambda r: json.dumps(r, default=str))
    return [f"{c} {types[c]}" for c in order], floats, rows


def load_output(out: Path) -> tuple[dict[str, Table], dict[str, Any]]:
    """Every table of a report output, and its summary without the (machine-local) paths."""
    summary = json.loads((out / "summary.json").read_text())
    names = sorted(summary.pop("tables"))
    return {name: load_table(out / name) for name in names}, summary


def _close(a: Any, b: Any, rel: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel)
    return a == b


def diff_json(a: Any, b: Any, rel: float, where: str = "summary") -> list[str]:
    """Differences between two JSON documents, floats within ``rel``."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))} differ"]
        return [d for k in a for d in diff_json(a[k], b[k], rel, f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} != {len(b)} items"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in diff_json(x, y, rel, f"{where}[{i}]")]
    if isinstance(a, int | float) and isinstance(b, int | float) and type(a) is not type(b):
        return [] if _close(float(a), float(b), rel) else [f"{where}: {a!r} != {b!r}"]
    return [] if _close(a, b, rel) else [f"{where}: {a!r} != {b!r}"]


def diff_outputs(a: Path, b: Path, rel: float = 0.0) -> tuple[list[str], dict[str, int]]:
    """Differences between two report outputs, and how many values were compared."""
    tables_a, summary_a = load_output(a)
    tables_b, summary_b = load_output(b)
    problems = diff_json(summary_a, summary_b, rel)
    counts = {"values": 0, "floats": 0, "floats_not_bit_identical": 0}
    if set(tables_a) != set(tables_b):
        return [*problems, f"tables {sorted(set(tables_a) ^ set(tables_b))} differ"], counts
    for name in tables_a:
        (cols_a, floats, rows_a), (cols_b, _, rows_b) = tables_a[name], tables_b[name]
        if cols_a != cols_b or len(rows_a) != len(rows_b):
            problems.append(f"{name}: columns or row counts differ")
            continue
        names = [c.split(" ", 1)[0] for c in cols_a]
        for row_a, row_b in zip(rows_a, rows_b, strict=True):
            for col, x, y in zip(names, row_a, row_b, strict=True):
                counts["values"] += 1
                if col in floats:
                    counts["floats"] += 1
                    counts["floats_not_bit_identical"] += x != y and x is not None
                if not _close(x, y, rel):
                    problems.append(f"{name}.{col}: {x!r} != {y!r} in {row_a}")
    return problems, counts


def fingerprint(out: Path) -> dict[str, Any]:
    """A compact stand-in for a whole output (see the module docstring)."""
    tables, summary = load_output(out)
    doc: dict[str, Any] = {"summary": summary, "tables": {}}
    for name, (columns, floats, rows) in tables.items():
        exact = [r[: len(columns) - len(floats)] for r in rows]
        digest = hashlib.sha256(json.dumps(exact, default=str).encode()).hexdigest()
        sums = {}
        for i, col in enumerate(floats, len(columns) - len(floats)):
            values = [r[i] for r in rows if r[i] is not None]
            weighted = [(n + 1) * r[i] for n, r in enumerate(rows) if r[i] is not None]
            sums[col] = [math.fsum(values), math.fsum(weighted), len(values)]
        doc["tables"][name] = {"columns": columns, "rows": len(rows), "exact": digest, "sums": sums}
    return doc


def diff_fingerprints(got: dict[str, Any], want: dict[str, Any], rel: float) -> list[str]:
    return diff_json(got, want, rel, "output")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.compare", description=__doc__)
    parser.add_argument("outputs", nargs="+", type=Path, help="report output directories")
    parser.add_argument("--fingerprint", action="store_true", help="print OUT's fingerprint")
    parser.add_argument("--against", type=Path, help="a fingerprint file to compare OUT with")
    parser.add_argument("--rel", type=float, default=0.0, help="relative tolerance of floats")
    args = parser.parse_args(argv)
    if args.fingerprint or args.against:
        if len(args.outputs) != 1:
            parser.error("--fingerprint and --against take one output directory")
        doc = fingerprint(args.outputs[0])
        if args.fingerprint:
            print(json.dumps(doc, indent=1, sort_keys=True))
            return 0
        problems = diff_fingerprints(doc, json.loads(args.against.read_text()), args.rel)
        counts: dict[str, int] = {}
    else:
        if len(args.outputs) != 2:
            parser.error("give two output directories")
        problems, counts = diff_outputs(*args.outputs, rel=args.rel)
    for line in problems[:50]:
        print(line, file=sys.stderr)
    print(json.dumps({"same": not problems, "differences": len(problems), **counts}))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
