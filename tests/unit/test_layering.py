"""The package layering docs/architecture.md describes, checked where it can break."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import brokerd

BROKERD = Path(brokerd.__file__).resolve().parent
HEAVY = ("lark", "pamqp", "brokerd.model.broker")


@pytest.mark.integration  # starts a Python process
@pytest.mark.parametrize("module", ["brokerd.config", "brokerd.configdoc"])
def test_the_configuration_modules_load_no_parser_no_codec_no_model(module: str) -> None:
    """The Django console and the Celery workers import these: neither lark (the
    x-selector grammar), pamqp nor the broker model comes with them."""
    code = f"import {module}, sys; print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def imported_modules(source: str, package: str) -> set[str]:
    """Every module a file of ``package`` imports, wherever the import stands
    (TYPE_CHECKING blocks, functions): relative names resolved against ``package``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_consolelink_never_imports_the_server() -> None:
    """consolelink sits below the server and types against its ConsoleHost; not even
    a TYPE_CHECKING import of brokerd.server."""
    assert offending_imports("brokerd.consolelink", ("brokerd.server",)) == {}


def test_bridges_are_clients_of_brokers_and_import_nothing_of_the_broker() -> None:
    """A bridge reaches this broker over its listener like any client: brokerd.bridges
    uses the wire codec and nothing of the model, the cluster, the server or the store."""
    forbidden = ("brokerd.model", "brokerd.cluster", "brokerd.server", "brokerd.store")
    assert offending_imports("brokerd.bridges", forbidden) == {}


def test_the_import_check_sees_type_checking_and_relative_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from brokerd.server.app import Server\n"
        "def later():\n"
        "    import brokerd.server.metrics\n"
        "from ..server import dump\n"
    )
    names = imported_modules(source, "brokerd.consolelink")
    assert {
        "brokerd.server.app",
        "brokerd.server.metrics",
        "brokerd.server",
        "brokerd.server.dump",
    } <= names


def offending_imports(package: str, forbidden: tuple[str, ...], root: Path = BROKERD) -> dict:
    """Files of ``package`` (a folder under ``root``) importing any of ``forbidden``
    (module names or their packages), TYPE_CHECKING imports included."""
    folder = root.joinpath(*package.split(".")[1:])
    files = sorted(folder.rglob("*.py"))
    assert files, folder
    found = {}
    for path in files:
        pkg = ".".join(path.relative_to(root.parent).parent.parts)
        names = sorted(
            name
            for name in imported_modules(path.read_text(), pkg)
            if any(name == f or name.startswith(f + ".") for f in forbidden)
        )
        if names:
            found[str(path.relative_to(root.parent))] = names
    return found


#: the cluster's layers, bottom up: each imports only from those below it (issue 39)
CLUSTER_LAYERS = {
    # the message plane is a transport: links and records, nothing of queues or the
    # decisions about them
    "brokerd.cluster.plane": (
        "brokerd.cluster.queues",
        "brokerd.cluster.ownership.placer",
        "brokerd.cluster.ownership.moves",
        "brokerd.cluster.controller",
        "brokerd.cluster.membership",
        "brokerd.cluster.wiring",
    ),
    # the shared queues on this server: on the transport, below the root's decisions
    "brokerd.cluster.queues": (
        "brokerd.cluster.ownership",
        "brokerd.cluster.controller",
        "brokerd.cluster.wiring",
    ),
    # where queues live, as the root decides: on the queues, below the controller
    "brokerd.cluster.ownership": ("brokerd.cluster.controller",),
}


@pytest.mark.parametrize("package", sorted(CLUSTER_LAYERS))
def test_the_cluster_layers_import_only_downwards(package: str) -> None:
    assert offending_imports(package, CLUSTER_LAYERS[package]) == {}


def test_a_planted_upward_import_fails_the_layering(tmp_path: Path) -> None:
    """The check sees an import of the queues planted in the plane (a copy of the tree,
    one file added)."""
    import shutil

    tree = tmp_path / "brokerd"
    shutil.copytree(BROKERD / "cluster" / "plane", tree / "cluster" / "plane")
    (tree / "cluster" / "plane" / "planted.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from brokerd.cluster.queues.shared import SharedQueue\n"
    )
    found = offending_imports(
        "brokerd.cluster.plane", CLUSTER_LAYERS["brokerd.cluster.plane"], tree
    )
    assert found == {
        "brokerd/cluster/plane/planted.py": [
            "brokerd.cluster.queues.shared",
            "brokerd.cluster.queues.shared.SharedQueue",
        ]
    }


@pytest.mark.parametrize(
    "package",
    [
        "brokerd.server",
        "brokerd.cluster",
        "brokerd.model",
        "brokerd.protocol",
        "brokerd.store",
        "brokerd.wire",
        "brokerd.consolelink",
    ],
)
def test_nothing_below_the_host_imports_it(package: str) -> None:
    """brokerd/host/ runs workers, each an ordinary server: it knows the server, and
    nothing the server is made of knows it (brokerd.server.worker reads its state)."""
    assert offending_imports(package, ("brokerd.host",)) == {}
