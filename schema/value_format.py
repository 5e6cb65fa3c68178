"""The value format of a typed table, in the shape `broker/kafka_batches.py` plugs in (like RawValueFormat)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from fluvial.schema.codecs import AvroValueCodec, ValueCodec

# Each record's writer schema id. A batch may mix writer versions, so the id is kept per
# record (4 bytes a record) beside the batch-level `BatchMeta.schema_id`.
SCHEMA_ID_FIELD = pa.field("_schema_id", pa.int32(), nullable=False)
MIXED_SCHEMA_IDS = -2  # BatchMeta.schema_id of a batch whose records have different writer ids


class TypedValueFormat:
    """Avro or JSON values <-> the typed user columns of a table (plus `_schema_id`)."""

    def __init__(self, codec: ValueCodec):
        self.codec = codec
        self.name = "avro" if isinstance(codec, AvroValueCodec) else "json"

    @property
    def user_fields(self) -> list[pa.Field]:
        """The stored columns after the system ones; they follow the table schema's evolution."""
        return [SCHEMA_ID_FIELD, *self.codec.table_schema]

    def to_columns(self, values: pa.BinaryArray) -> tuple[list[pa.Array], int]:
        """Produce path: the batch's values as columns, and the batch's schema id
        (MIXED_SCHEMA_IDS when its records use several). Raises InvalidRecordError."""
        columns, ids = self.codec.decode(values)
        uniform = int(ids[0]) if ids.size and (ids == ids[0]).all() else MIXED_SCHEMA_IDS
        return [pa.array(ids, pa.int32()), *columns.flatten()], uniform

    def to_values(self, batch: pa.RecordBatch, schema_id: int) -> pa.Array:
        """Fetch path: the values of a stored batch (any earlier table schema), each record
        encoded with its own writer schema."""
        names = [n for n in batch.schema.names if not n.startswith("_")]
        columns = pa.StructArray.from_arrays([batch.column(n) for n in names],
                                             fields=[batch.schema.field(n) for n in names])
        if SCHEMA_ID_FIELD.name in batch.schema.names:
            ids = batch.column(SCHEMA_ID_FIELD.name).to_numpy(zero_copy_only=False)
        else:
            ids = np.full(batch.num_rows, schema_id, np.int32)
        return self.codec.encode(columns, ids)
