"""Authentication and authorization shared by the Kafka listener, the HTTP port (schema registry,
console) and the table API (Arrow Flight): who a client is (`principal`), how it proves it
(`users`: SCRAM credentials, TLS certificates), and what it may do (`acls`, `authorizer`)."""
