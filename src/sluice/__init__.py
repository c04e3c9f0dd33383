"""Sluice: a change-data sync platform on a replicated, Kafka-compatible log."""

__version__ = "0.1.0"
