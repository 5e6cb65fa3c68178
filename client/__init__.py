"""Native Python client for the table API."""
