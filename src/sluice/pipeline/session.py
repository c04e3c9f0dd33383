"""The Spark session Sluice's jobs run in: `local[*]` by default, or a cluster master URL."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_MASTER = "local[*]"


def spark_session(master: str | None = None, app: str = "sluice", conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with the `sluice` data source registered.

    Executors run this interpreter (the venv's), so they import the same Sluice."""
    from pyspark.sql import SparkSession

    from sluice.pipeline.source import SluiceDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or DEFAULT_MASTER
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = Path(__file__).with_name("log4j2.properties")
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.metricsEnabled", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.log.level", "ERROR")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SluiceDataSource)
    return spark
