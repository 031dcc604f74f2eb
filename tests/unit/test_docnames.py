"""The doc-name check (``tests/support/docnames.py``, run by ``make lint``): the
repository's docs pass, and each kind of stale name planted in a page is caught."""

from __future__ import annotations

from pathlib import Path

from tests.support import docnames


def test_the_repository_docs_name_only_what_exists() -> None:
    counted: list[int] = []
    stale = [s for doc in docnames.documents() for s in docnames.check(doc, counted=counted)]
    assert stale == []
    assert sum(counted) > 100  # the check sees the names, not nothing


def test_each_kind_of_stale_name_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See `brokerd/cluster/plane/flow.py` and `brokerd/cluster/no_such_module.py`.\n"
        "Runbook: [here](deploy/runbooks/gone.md), `cluster-root.md`, `missing-page.md`.\n"
        "```sh\n"
        "make test-fast\n"
        "make no-such-target\n"
        "python -m tests.faults.catch_up --runs 1\n"
        "python -m brokerd.bench.nothing\n"
        "brokerd ctl --data-dir /var/lib/rookery/b1 status\n"
        "brokerd ctl frobnicate\n"
        "```\n"
        "A running broker writes under `var/` and `/var/lib/rookery/b1/brokerd.log`.\n"
        "pika's `tests/acceptance` is pika's own.\n"
    )
    found = {(s.kind, s.name) for s in docnames.check(page)}
    assert found == {
        ("path", "brokerd/cluster/no_such_module.py"),
        ("path", "deploy/runbooks/gone.md"),
        ("page", "missing-page.md"),
        ("make target", "no-such-target"),
        ("module", "brokerd.bench.nothing"),
        ("ctl command", "frobnicate"),
    }
    assert docnames.main([str(page)]) == 1
