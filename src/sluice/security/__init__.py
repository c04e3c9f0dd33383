"""Security: who a connection is (SASL, TLS), what it may do (ACLs), and the secrets it holds."""
