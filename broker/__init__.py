"""The asyncio broker: connections, request handlers, metadata, log storage, CLI."""
