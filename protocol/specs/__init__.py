"""Message schemas (Kafka's JSON message-spec format) of APIs whose classes kafka-python lacks.

Each file describes the wire fields of one request or response: names, types, the versions
they appear in and their nullability; `protocol/messages.py` builds codec classes from them
with kafka-python's schema machinery, so these APIs are encoded like every other.
"""
