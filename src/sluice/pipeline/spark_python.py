"""The interpreter Spark starts its Python processes with (`sluice-spark-python`, what
`pipeline.session.spark_session` makes PYSPARK_PYTHON unless the environment names another).

Why: a Python streaming source's runner (pyspark.sql.streaming.python_streaming_source_runner,
started by the driver at each start of a query on the Sluice source, through
PythonWorkerFactory.createSimpleWorker) must connect back to the JVM within a fixed 10 s, and
Spark has no setting for it. Run as `python -m <runner>`, the process connects only after the
module's imports (pyspark, pyarrow, numpy, pandas: 0.3 s on a quiet machine, 3.5 s and more at
load 9 on two cores), so a starved machine failed query starts with "Python worker failed to
connect back." (issue 32). Here the runner connects and authenticates first, with the standard
library only (the interpreter's own start, tens of milliseconds), and imports its module after:
the imports then count against the 120 s the JVM gives the handshake's reads
(spark.python.authenticate.socketTimeout), not against the 10 s.

The connection is the one `pyspark.worker_util.get_sock_file_to_executor` makes (pyspark 4.2):
a Unix socket at PYTHON_WORKER_FACTORY_SOCK_PATH, or TCP to PYTHON_WORKER_FACTORY_PORT on
loopback with the secret PYTHON_WORKER_FACTORY_SECRET (length-prefixed, answered "ok"), then the
process id as a 4-byte big-endian int. Every other module Spark asks for (the daemon, its
workers, the other runners) is run exactly as `python -m` would: the interpreter is replaced.
"""

from __future__ import annotations

import importlib
import os
import socket
import struct
import sys
from collections.abc import Mapping
from typing import IO, cast

#: modules whose process connects back first, with the socket timeout their own `__main__` sets
#: after the handshake (None: none)
EARLY_CONNECT: dict[str, float | None] = {
    "pyspark.sql.streaming.python_streaming_source_runner": None,
}


class ConnectBackError(RuntimeError):
    pass


def _stream(sock: socket.socket, buffer_size: int) -> IO[bytes]:
    return cast(IO[bytes], sock.makefile("rwb", buffer_size))


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise ConnectBackError("Spark closed the connection during the Python worker's handshake")
    return data


def connect_back(environ: Mapping[str, str] = os.environ) -> tuple[IO[bytes], socket.socket]:
    """The connection to the JVM that started this process, authenticated, with this process's
    id sent: what pyspark's `get_sock_file_to_executor` makes."""
    secret = environ.get("PYTHON_WORKER_FACTORY_SECRET")
    path = environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    timeout = int(environ.get("SPARK_AUTH_SOCKET_TIMEOUT", "15"))
    buffer_size = int(environ.get("SPARK_BUFFER_SIZE", "65536"))
    if path is not None and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise ConnectBackError(f"cannot connect back to Spark at {path}: {exc}") from exc
        stream = _stream(sock, buffer_size)
    else:
        port = environ.get("PYTHON_WORKER_FACTORY_PORT")
        if port is None or secret is None:
            raise ConnectBackError("not started by Spark: no PYTHON_WORKER_FACTORY_PORT and secret")
        host = "::1" if environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        errors = []
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, int(port), socket.AF_UNSPEC, socket.SOCK_STREAM
        ):
            sock = socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            try:
                sock.connect(address)
                break
            except OSError as exc:
                errors.append(f"{address}: {exc}")
                sock.close()
        else:
            raise ConnectBackError(f"cannot connect back to Spark: {'; '.join(errors)}")
        stream = _stream(sock, buffer_size)
        token = secret.encode("utf-8")
        stream.write(struct.pack("!i", len(token)) + token)
        stream.flush()
        (length,) = struct.unpack("!i", _read_exactly(stream, 4))
        if length < 0 or _read_exactly(stream, length) != b"ok":
            sock.close()
            raise ConnectBackError("Spark refused the Python worker's secret")
    stream.write(struct.pack("!i", os.getpid()))
    stream.flush()
    return stream, sock


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "-m":
        # Not a start by Spark (which always runs `<python> -m <module>`): act as the interpreter.
        os.execv(sys.executable, [sys.executable, *args])
    module = args[1]
    if module not in EARLY_CONNECT:
        os.execv(sys.executable, [sys.executable, *args])
    stream, sock = connect_back()
    sock.settimeout(EARLY_CONNECT[module])
    try:
        importlib.import_module(module).main(stream, stream)
    finally:
        stream.close()


if __name__ == "__main__":
    main()
