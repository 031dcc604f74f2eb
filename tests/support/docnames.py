"""Every name the docs give for something in the repository still exists.

    python -m tests.support.docnames          # make lint runs it; exit 1 on a stale name

Checks README.md, docs/ and deploy/ (Markdown): repository paths in inline
code, code blocks and links (``brokerd/cluster/plane/flow.py``, ``deploy/runbooks/``,
``store-integrity.md`` beside the page naming it), ``make`` targets,
``python -m`` modules and ``brokerd ctl`` subcommands. Whether a sentence is
true is a reviewer's job; whether the names in it still exist is the
machine's. Paths the running system creates (``var/``, ``.venv/``) and
absolute paths (an operator's ``/var/lib/rookery``) are not the
repository's, so they are not checked.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: top-level entries a path must start with to count as the repository's
TOP = (
    "brokerd",
    "clusterapi",
    "console",
    "deploy",
    "docs",
    "pipeline",
    "static",
    "templates",
    "tests",
    ".ci",
)
#: made by the running system or the build, not in a clean checkout
RUNTIME = ("var/", ".venv/", "node_modules/", "static/vendor/")
#: pages outside the repository, by design: the product specification beside it
#: (docs/design.md says where it is and what the code takes from it)
EXTERNAL_PAGES = ("DESIGN.md",)
#: a code span right after one of these names a path in that project's checkout
OTHER_PROJECTS = ("pika", "aio-pika", "aiormq", "kombu", "celery", "rabbitmq")
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?$(.*?)^```", re.MULTILINE | re.DOTALL)
PATH = re.compile(r"(?<![\w./-])((?:\.ci|[a-z][a-z_]*)/[\w./-]*[\w/])")
MAKE = re.compile(r"\bmake ([a-z][\w-]*)")
MODULE = re.compile(r"python3? -m ([a-z_][\w.]*)")
CTL = re.compile(r"brokerd ctl (?:--[\w-]+(?: \S+)? )*([a-z][\w-]*)")
MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")


@dataclass(frozen=True)
class Stale:
    doc: Path
    line: int
    kind: str
    name: str

    def __str__(self) -> str:
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc
        return f"{doc}:{self.line}: {self.kind} {self.name!r} does not exist"


def documents(root: Path = ROOT) -> list[Path]:
    docs = [root / "README.md"]
    for folder in ("docs", "deploy"):
        docs += sorted((root / folder).rglob("*.md"))
    return [d for d in docs if d.is_file()]


def make_targets(root: Path = ROOT) -> set[str]:
    text = (root / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.MULTILINE))


def ctl_commands(root: Path = ROOT) -> set[str]:
    text = (root / "brokerd" / "ctl" / "__init__.py").read_text()
    return set(re.findall(r"add_parser\(\s*\"([\w-]+)\"", text))


def module_exists(name: str, root: Path = ROOT) -> bool:
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    return name.split(".")[0] not in TOP  # a dependency's module (pip, pytest, django)


def _spans(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span, code block line and link."""
    spans: list[tuple[int, str]] = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        for offset, line in enumerate(block.group(1).split("\n")):
            spans.append((first + offset, line))
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for number, line in enumerate(outside.split("\n"), start=1):
        for m in CODE.finditer(line):
            before = line[: m.start()].split()
            owner = before[-1].lower().removesuffix("'s") if before else ""
            if owner not in OTHER_PROJECTS:
                spans.append((number, m.group(1)))
        spans += [(number, m.group(1)) for m in LINK.finditer(line)]
    return spans


def _path_exists(name: str, doc: Path, root: Path) -> bool:
    name = name.split("#")[0].rstrip(".,:;")
    if not name or name.startswith(RUNTIME):
        return True
    return (root / name).exists() or (doc.parent / name).exists()


def _page_exists(name: str, doc: Path, root: Path) -> bool:
    """A page named bare: beside the naming page, at the top, or anywhere below."""
    if name in EXTERNAL_PAGES or (doc.parent / name).exists() or (root / name).exists():
        return True
    return any(root.glob(f"*/**/{name}"))


def check(doc: Path, root: Path = ROOT, counted: list[int] | None = None) -> list[Stale]:
    """The stale names in ``doc``; ``counted`` gets the number of names checked."""
    targets, commands = make_targets(root), ctl_commands(root)
    stale: list[Stale] = []
    names = 0
    for line, span in _spans(doc.read_text()):
        if "://" in span:
            continue  # a URL, not a path
        for m in PATH.finditer(span):
            name = m.group(1)
            if name.split("/")[0] in TOP:
                names += 1
                if not _path_exists(name, doc, root):
                    stale.append(Stale(doc, line, "path", name))
        for m in MD.finditer(span):
            name = m.group(1)
            names += 1
            if not _page_exists(name, doc, root):
                stale.append(Stale(doc, line, "page", name))
        for kind, pattern, exists in (
            ("make target", MAKE, targets.__contains__),
            ("module", MODULE, lambda name: module_exists(name.rstrip("."), root)),
            ("ctl command", CTL, commands.__contains__),
        ):
            for m in pattern.finditer(span):
                names += 1
                if not exists(m.group(1)):
                    stale.append(Stale(doc, line, kind, m.group(1)))
    if counted is not None:
        counted.append(names)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("docs", nargs="*", type=Path, help="default: README.md, docs/, deploy/")
    opts = parser.parse_args(argv)
    docs = [d.resolve() for d in opts.docs] or documents()
    counted: list[int] = []
    stale = [s for doc in docs for s in check(doc, counted=counted)]
    for entry in stale:
        print(entry)
    print(f"{len(docs)} documents, {sum(counted)} names, {len(stale)} stale", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
