"""The table API on Arrow Flight: scans with projection and filters, follow, appends, table metadata."""
from fluvial.broker.flight.server import TableFlightServer, start_flight, stop_flight

__all__ = ["TableFlightServer", "start_flight", "stop_flight"]
