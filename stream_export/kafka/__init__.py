"""Kafka without Faust: connections with the configured security, topics from their specs,
topic identity.
"""
