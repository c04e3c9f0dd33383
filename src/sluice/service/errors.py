"""What a service call can refuse, with the HTTP status the manager answers it with."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service refuses; `str(err)` says what happened and what to do next."""

    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFoundError(ServiceError):
    status = 404


class InvalidError(ServiceError):
    """A definition or an argument that fails validation; `field` names the bad one."""

    status = 422


class ConflictError(ServiceError):
    status = 409


class UnavailableError(ServiceError):
    """The cluster could not answer now (no broker reachable, ZooKeeper down): try again."""

    status = 503
