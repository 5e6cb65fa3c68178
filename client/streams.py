"""Scan results as Arrow streams: a RecordBatchReader, the Arrow PyCapsule stream protocol,
Polars and pandas.

A stream never holds the whole result: batches are read from the broker as the consumer
asks for them (each bucket's stream is read ahead by at most a few batches), so DuckDB,
Polars or pyarrow can aggregate a scan larger than memory. Nothing is requested before the
first batch is asked for: the schema is known from the table's description.
"""
from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa


class ArrowResults:
    """Stream access shared by `Scan` and `UnionScan` (they give `to_batches` and `output_schema`)."""

    def to_batches(self) -> Iterator[pa.RecordBatch]:  # pragma: no cover - given by the scan classes
        raise NotImplementedError

    def output_schema(self) -> pa.Schema:  # pragma: no cover - given by the scan classes
        raise NotImplementedError

    def to_reader(self) -> pa.RecordBatchReader:
        """The rows as a `pyarrow.RecordBatchReader`, read from the broker as they are consumed
        (bounded memory). Closing the reader or leaving it unread ends the scan's streams.

        >>> reader = t.scan(columns=["id", "amount"]).to_reader()
        >>> for batch in reader: ...
        """
        schema = self.output_schema()
        return pa.RecordBatchReader.from_batches(schema, _conformed(self.to_batches(), schema))

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream protocol: DuckDB (`duckdb.sql("select ... from scan")`),
        Polars (`pl.from_arrow(scan)`), pyarrow (`pa.table(scan)`, `pa.RecordBatchReader.from_stream(scan)`)
        and others read the scan as a stream, without a copy into an intermediate table."""
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def with_columns(self, columns: list[str]) -> "ArrowResults":  # pragma: no cover - given by the scan classes
        """The same scan (filter, offsets, buckets) returning only `columns`."""
        raise NotImplementedError

    def to_polars(self, lazy: bool = False) -> Any:
        """The rows as a Polars DataFrame, imported from the stream (needs polars).

        lazy=True: a Polars LazyFrame instead, read only when collected; the columns the
        query uses are the only ones read from Fluvial (projection pushdown), rows stream
        batch by batch (`collect(engine="streaming")` keeps memory bounded), and a `head`
        stops the read early. Polars predicates are applied by Polars to each batch: give
        the scan a `filter` to have Fluvial skip batches.

        >>> t.scan(filter=pc.field("amount") > 10).to_polars(lazy=True).group_by("city").agg(pl.len()).collect()
        """
        import polars as pl

        if not lazy:
            return pl.from_arrow(self.to_reader(), rechunk=False)
        from polars.io.plugins import register_io_source

        schema = pl.from_arrow(self.output_schema().empty_table()).schema
        names = list(schema.names())

        def source(with_columns, predicate, n_rows, batch_size) -> Iterator[Any]:
            wanted = [c for c in names if c in with_columns] if with_columns is not None else names
            # A query that needs no column (a row count) still reads one, the first.
            scan = self if wanted == names else self.with_columns(wanted or names[:1])
            left = n_rows
            for batch in scan.to_batches():
                frame = pl.from_arrow(batch, rechunk=False)
                if predicate is not None:
                    frame = frame.filter(predicate)
                if left is not None:
                    frame = frame.head(left)
                    left -= frame.height
                yield frame
                if left is not None and left <= 0:
                    return

        return register_io_source(source, schema=schema)


def _conformed(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Batches carrying exactly the stream's schema (the broker's differs at most in field metadata)."""
    for batch in batches:
        if not batch.schema.equals(schema, check_metadata=True):
            if batch.schema.equals(schema, check_metadata=False) or [f.type for f in batch.schema] == schema.types:
                batch = pa.RecordBatch.from_arrays(batch.columns, schema=schema)
            else:
                batch = batch.cast(schema)
        yield batch
