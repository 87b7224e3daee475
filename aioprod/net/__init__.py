"""Broker connections: TCP streams, framing, correlation ids, in-flight limits."""
