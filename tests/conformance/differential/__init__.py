"""The differential conformance suite's helpers (issue 20): one driver per client library
(``drivers``), the scenarios every driver runs (``scenarios``), raw-protocol scenarios
(``wire``) and what is normalized before Kafka's and Sluice's answers are compared
(``normalize``)."""
