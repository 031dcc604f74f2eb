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


# Spark's log: warnings and up into a file the tests read, only errors on the terminal.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.console.ref = console
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %p %c: %m%n
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
"""


@pytest.fixture(scope="session")
def spark_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the test session's Spark (driver and executors: local mode) logs into."""
    root = tmp_path_factory.mktemp("spark-log")
    (root / "log4j2.properties").write_text(LOG4J2.format(path=root / "spark.log"))
    return root / "spark.log"


@pytest.fixture(scope="session")
def spark(spark_log: Path) -> Iterator[Any]:
    if not java_available():
        pytest.skip("Java is missing: PySpark needs a JRE (Debian: default-jre-headless)")
    from pipeline.report import spark_session

    config = spark_log.with_name("log4j2.properties")
    session = spark_session(
        "local[2]",
        extra={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.sql.adaptive.enabled": "false",
            # read when the JVM starts: this session must be the test process's first
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={config}",
        },
    )
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
