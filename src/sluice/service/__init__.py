"""The one service layer the CLI and the manager's REST API both call, so they cannot disagree.

Each function takes a `Services` (connections to ZooKeeper and the brokers) and returns plain
data (dicts and lists that serialise to JSON as they are). Errors are `ServiceError`s that carry
what went wrong in words a user can act on, and a kind the API maps to an HTTP status.
"""
