"""Kafka's wire format as pure functions and objects: bytes in, objects out, no I/O."""
