"""The documents describe the repository as it is: every performance figure README.md states is
one BENCHMARKS.md states, every file, link and module the documents cite exists, README's sink
example is the demo sink, and README stays a short page that starts with the two commands.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "include" / "reconcile"
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

# -- README's figures --------------------------------------------------------------------------

_NOT_FIGURES = [
    re.compile(r"\S+://\S+"),  # URLs (hosts, ports)
    re.compile(r"\d{4}-\d\d-\d\d(?:T[\d:.]+Z?)?"),  # dates and date-times
    re.compile(
        r"\b(?:Python|Java|Airflow|Spark|Delta Lake|Delta|pyspark|PostgreSQL|Go|Node.js)\s+\d+(?:\.\d+)*"
    ),  # versions
]
_WITH_UNIT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s?(s|ms|min)|(x|%))(?!\w)")
_DECIMAL = re.compile(r"(?<![\w.:/-])(\d+\.\d+)(?![\w.]\w)")
_DURATION = re.compile(r"(?<![\d:])(\d+:\d\d)(?![\d:])")


def figures(text: str) -> set[str]:
    """The figures a text states: numbers with a unit of time or a ratio (``11.6 s``, ``240x``,
    ``1%``), decimal numbers (ratios such as ``0.58``) and durations (``10:09``); versions, dates
    and URLs are not figures."""
    for pattern in _NOT_FIGURES:
        text = pattern.sub(" ", text)
    found = set()
    for m in _WITH_UNIT.finditer(text):
        unit = m.group(2) or m.group(3)
        found.add(f"{m.group(1)} {unit}" if m.group(2) else f"{m.group(1)}{unit}")
    spans = [m.span(1) for m in _WITH_UNIT.finditer(text)]
    for m in _DECIMAL.finditer(text):
        if m.span(1) not in spans:
            found.add(m.group(1))
    found.update(m.group(1) for m in _DURATION.finditer(text))
    return found


def stated_in(figure: str, text: str) -> bool:
    """Does ``text`` state ``figure``? A decimal or a duration must appear as a number of its
    own (``1.09`` in a table of seconds counts, ``11.6`` inside ``111.6`` does not); an integer
    with a unit must appear with that unit (``240x``, ``1%``)."""
    number, _, unit = figure.partition(" ")
    m = re.fullmatch(r"(\d+)(x|%)", number)
    if m:
        number, unit = m.groups()
    bounded = rf"(?<![\d.]){re.escape(number)}(?![\d])"
    if "." in number or ":" in number:
        return re.search(bounded, text) is not None
    return re.search(bounded + rf"\s?{re.escape(unit)}(?!\w)", text) is not None


def test_every_figure_readme_states_is_the_one_benchmarks_states():
    readme = (ROOT / "README.md").read_text()
    benchmarks = (ROOT / "BENCHMARKS.md").read_text().replace("*", "")
    stated = figures(readme)
    assert len(stated) >= 4, f"README.md states too few figures to check: {sorted(stated)}"
    missing = sorted(f for f in stated if not stated_in(f, benchmarks))
    assert not missing, f"README.md states figures BENCHMARKS.md does not: {missing}"


def test_a_stale_figure_would_be_caught():
    text = "on Connect 13.6 s instead of 31.1 s (Python 3.11, Spark 4.2, 2026-01-02T00:00:00Z); 0.58 of MERGE, 240x, 1%"
    assert figures(text) == {"13.6 s", "31.1 s", "0.58", "240x", "1%"}
    benchmarks = "| append | **0.022 s** | 11.6 s | 0.58 | 1% | 240x cheaper |".replace("*", "")
    assert [f for f in sorted(figures(text)) if not stated_in(f, benchmarks)] == ["13.6 s", "31.1 s"]
    assert not stated_in("1.6 s", "11.6 s") and not stated_in("2x", "12x")


# -- README's shape ----------------------------------------------------------------------------


def test_readme_is_one_short_page_that_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120, f"README.md has {len(readme.splitlines())} lines (at most 120)"
    first = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first, "README.md has no bash block"
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_readme_sink_example_is_the_demo_sink():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert len(blocks) == 1, "README.md shows one sink"
    demo = ROOT / "include" / "sinks" / "demo_orders.yaml"
    assert yaml.safe_load(blocks[0]) == yaml.safe_load(demo.read_text()), f"README's sink differs from {demo}"


# -- cited files, links and modules ------------------------------------------------------------


def _repository_paths() -> set[str]:
    """Files of the repository (tracked, or new and not ignored) and their folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what is on disk
        out = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    paths: set[str] = set()
    for f in filter(None, out):
        if (ROOT / f).exists():  # deleted in the working tree: gone
            paths.add(f)
            paths.update(str(parent) for parent in Path(f).parents if str(parent) != ".")
    return paths


REPO = _repository_paths()
_EXT = r"(?:py|md|sh|yaml|yml|json|png|txt|toml|ini|cfg|mako)"
_FILE = re.compile(rf"(?<![\w./$<>{{}}*~-])((?:[\w.-]+/)*[\w-][\w.-]*\.{_EXT})(?![\w/-]|\.\w)")
_CODE_PATH = re.compile(r"`([\w.-]+/[^`\s<>*${}]*)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MODULE = re.compile(r"\breconcile(?:\.\w+)+")


def _resolve(doc: Path, cited: str) -> str | None:
    """The repository path a document means by ``cited``: relative to the document, to the
    repository's root, or (for the package's own modules, e.g. ``sink/mint.py``) to the package."""
    cited = cited.rstrip("/")
    for base in (doc.parent, ROOT, PACKAGE, ROOT / "include"):
        candidate = (base / cited).resolve()
        try:
            rel = str(candidate.relative_to(ROOT))
        except ValueError:
            continue
        if rel in REPO:
            return rel
    return None


def _slugs(md: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    heads = re.findall(r"^#+\s+(.*)$", md.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def _prose(text: str) -> str:
    """The text without URLs (a URL's path is not the repository's)."""
    return re.sub(r"https?://\S+", " ", text)


def _top_level(cited: str) -> bool:
    first = cited.split("/")[0]
    return first in REPO or f"include/reconcile/{first}" in REPO


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_and_link_a_document_cites_exists(doc):
    text = _prose(doc.read_text())
    problems = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = _resolve(doc, path) if path else str(doc.relative_to(ROOT))
        if resolved is None:
            problems.append(f"link {target!r}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in _slugs(ROOT / resolved):
            problems.append(f"link {target!r}: {resolved} has no heading #{anchor}")
    cited = set(_FILE.findall(text)) | {p for p in _CODE_PATH.findall(text) if _top_level(p)}
    for path in sorted(cited):
        if _resolve(doc, path) is None:
            problems.append(f"{path!r}: no such file or folder in the repository")
    assert not problems, f"{doc.relative_to(ROOT)} cites what does not exist: {problems}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_document_names_exists(doc):
    problems = []
    from reconcile.storage.current import PROPERTIES  # the current table's properties: no modules

    for dotted in sorted(set(_MODULE.findall(doc.read_text())) - set(PROPERTIES)):
        rest, source = dotted.split(".")[1:], PACKAGE / "__init__.py"
        while rest and source.name == "__init__.py":  # down the packages to the module
            if (source.parent / rest[0]).is_dir():
                source = source.parent / rest.pop(0) / "__init__.py"
            elif (source.parent / f"{rest[0]}.py").is_file():
                source = source.parent / f"{rest.pop(0)}.py"
            else:
                break
        if rest and not re.search(rf"^\s*(?:class|def)\s+{rest[0]}\b|^{rest[0]}\s*[:=]", source.read_text(), re.M):
            problems.append(f"{dotted}: {source.relative_to(ROOT)} defines no {rest[0]!r}")
    assert not problems, f"{doc.relative_to(ROOT)} names what does not exist: {problems}"
