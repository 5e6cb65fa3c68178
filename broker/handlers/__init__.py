"""One module per Kafka API (or API family): read the request, build the response."""
