"""One local SparkSession and one generated lake for the whole pipeline test session."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.generate import generate

# Small enough for seconds of Spark work, long enough for every injected incident.
LAKE_ARGS: dict[str, Any] = {"brokers": 4, "queues": 3, "hours": 2.0, "seed": 11, "interval": 5.0}


def java_available() -> bool:
    """PySpark needs a JVM: `java` on PATH or under $JAVA_HOME."""
    home = os.environ.get("JAVA_HOME")
    return shutil.which("java") is not None or bool(home and Path(home, "bin", "java").exists())


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not java_available():
        pytest.skip("Java is missing: PySpark needs a JRE (Debian: default-jre-headless)")
    from pipeline.report import spark_session

    session = spark_session(
        "local[2]",
        extra={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # quiet py4j's shutdown chatter
    yield session
    session.stop()


@pytest.fixture(scope="session")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    generate(root, **LAKE_ARGS)
    return root


@pytest.fixture(scope="session")
def report(spark: Any, lake_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report over the whole generated lake: summary plus its output directory."""
    from pipeline.report import ReportOptions, run_report

    out = tmp_path_factory.mktemp("report")
    summary = run_report(ReportOptions(lake=str(lake_dir), out=str(out)), spark)
    return {"summary": summary, "out": out}
