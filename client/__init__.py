"""Native Python client for Fluvial's table API: projected, filtered, parallel scans; follow; append.

>>> import fluvial.client as fc
>>> client = fc.connect("grpc://127.0.0.1:8815")
>>> t = client.table("orders")
>>> t.scan(columns=["id", "amount"], filter=pc.field("amount") >= 100).to_arrow()
>>> duckdb.sql("select count(*) from scan")   # scan = t.scan(...): an Arrow stream
"""
from fluvial.client.client import BucketOffsets, Client, Scan, Table, TableInfo, connect
from fluvial.client.auth import ConnectionSecurity
from fluvial.client.errors import (
    AuthenticationError, AuthorizationError, BrokerUnavailableError, FilterColumnError, FilterError, FilterTypeError, FluvialError, InvalidRecordError, InvalidRequestError, InvalidTableError,
    OffsetOutOfRangeError, SchemaMismatchError, TableExistsError, UnknownColumnError, UnknownTableError,
)
from fluvial.client.wire import Appended, ScanStats

__all__ = [
    "Appended", "AuthenticationError", "AuthorizationError", "BrokerUnavailableError", "ConnectionSecurity", "BucketOffsets", "Client", "FilterColumnError", "FilterError",
    "FilterTypeError", "FluvialError", "InvalidRecordError",
    "InvalidRequestError", "InvalidTableError", "OffsetOutOfRangeError", "Scan", "ScanStats", "SchemaMismatchError",
    "Table", "TableExistsError", "TableInfo", "UnknownColumnError", "UnknownTableError", "connect",
]
