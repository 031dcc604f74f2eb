"""The short fault-injection run of ``make test`` (the soak: ``python -m tests.faults``).

One run per module (3 primaries and a secondary, four confirmed publishers
and four acking consumers over two shared queues, one fault of every kind
from a fixed seed, then a drain); each test checks one part of the report:
shared queues are replicated, so no confirmed message may be lost and no
message may come twice without the redelivered flag. A cut link drops what
it carries: each side ends the session, and a side that saw the end alone
tells the other with a ``void`` record (docs/protocol.md, "Void").

The seed fixes the schedule and the draws that pick targets; every kind comes
once, the operators' queue move and rebalance under traffic among them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.nemesis import KINDS
from tests.faults.run import Outcome, RunConfig, run

# serial: its timing is measured against the heartbeat, so it runs alone
pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

CONFIG = RunConfig(seed=2, faults=len(KINDS))


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    lines: list[str] = []
    result = run(CONFIG, tmp_path_factory.mktemp("faults"), log=lines.append)
    print("\n".join(lines))
    print(result.report.format())
    yield result


def context(outcome: Outcome) -> str:
    """The report, every server's view and log warnings, and where the full logs are."""
    return "\n".join(
        [outcome.report.format(), outcome.describe, "logs:", *outcome.logs, ""]
        + [f"fault: {f}" for f in outcome.report.per_fault]
    )


def test_every_process_and_client_was_cleaned_up(outcome: Outcome) -> None:
    assert outcome.leftover == [], context(outcome)
    assert outcome.stuck_clients == [], context(outcome)


def test_no_server_exited_by_itself(outcome: Outcome) -> None:
    assert outcome.crashes == [], context(outcome)


def test_every_fault_was_applied_undone_and_settled(outcome: Outcome) -> None:
    faults = outcome.history.faults
    assert sorted(f.kind for f in faults) == sorted(KINDS), context(outcome)
    assert all(f.end is not None and f.end >= f.start for f in faults), context(outcome)
    assert all(f.recovered is not None for f in faults), context(outcome)


def test_publishers_and_consumers_kept_working_after_every_fault(outcome: Outcome) -> None:
    history = outcome.history
    for fault in history.faults:
        after = fault.recovered or fault.start
        assert any(p.outcome == "ack" and p.sent > after for p in history.publishes), (
            f"nothing confirmed after {fault}\n{context(outcome)}"
        )
        assert any(d.at > after for d in history.deliveries), (
            f"nothing delivered after {fault}\n{context(outcome)}"
        )
    report = outcome.report
    assert report.confirmed > 1000 and report.received > 1000, context(outcome)


def test_the_drain_emptied_the_queues(outcome: Outcome) -> None:
    assert outcome.history.drained, context(outcome)


def test_no_order_violations_per_publisher(outcome: Outcome) -> None:
    assert outcome.report.order_violations == {}, context(outcome)


def test_nothing_delivered_that_was_not_published(outcome: Outcome) -> None:
    assert outcome.report.unknown == 0, context(outcome)


def test_no_confirmed_message_is_lost(outcome: Outcome) -> None:
    assert outcome.report.lost == 0, context(outcome)


def test_no_duplicate_without_the_redelivered_flag(outcome: Outcome) -> None:
    assert outcome.report.unflagged_duplicates == 0, context(outcome)
