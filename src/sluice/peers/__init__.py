"""Peers Sluice is measured beside (issue 20): Apache Kafka run locally from its own jars."""
