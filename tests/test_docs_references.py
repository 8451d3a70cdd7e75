"""No reference to a file that is not in the repository.

Scans the markdown (README.md, docs/, the folders' READMEs; not CHANGELOG.md, whose entries
name paths as they were then) and the comments and docstrings of the code (conformance/,
suites/, tests/, tools/, the profiles' TOML comments, the tools' shell scripts) for:

- repository paths: a word starting ``conformance/``, ``suites/``, ``tests/``, ``tools/`` or
  ``docs/``, taken from the repository root (``reports/`` is output: its paths name what a
  command writes, so they are not checked);
- markdown links ``[text](target)`` to a local target, taken from the linking file's folder;
- all-capital markdown file names (``NAME.md``), taken from the root or the citing file's folder;
- a README section cited by name (``README, "Section"``), which must be a README heading.

A path with a placeholder (``<timestamp>``, ``*``) is checked up to the placeholder.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a repository path: one of the top folders, then path characters (trailing "." or "-" dropped)
REPO_PATH = re.compile(r"(?<![\w./-])(?:conformance|suites|tests|tools|docs)/[\w./-]*")
#: where a path turns into a pattern: `reports/<timestamp>/`, `docs/figures/rl-*.png`, `{a,b}`
PLACEHOLDER = ("*", "<", "{", "[")
#: the target of a markdown link or image
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: BACKGROUND.md, ENGINES.md and the like
CAPS_MD = re.compile(r"(?<![\w./-])[A-Z][A-Z_]+\.md\b")
#: README, "Profiles" / README section "Profiles" / README's "Profiles"
README_SECTION = re.compile(r"README(?:'s)?,?\s+(?:section\s+)?\"([^\"]+)\"")

MARKDOWN_SKIP = {ROOT / "CHANGELOG.md"}
CODE_FOLDERS = ("conformance", "suites", "tests", "tools")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    files += [ROOT / folder / "README.md" for folder in ("reports", "tools", "suites", "tests")]
    return sorted(f for f in files if f.is_file() and f not in MARKDOWN_SKIP)


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


def hash_comments(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of the ``#`` comments of a shell script or TOML file."""
    for number, line in enumerate(source.splitlines(), 1):
        if "#" in line:
            yield number, line[line.index("#") :]


def prose() -> Iterator[tuple[Path, int, str]]:
    """(file, line, text) of every piece of text this test checks."""
    for md in markdown_files():
        for line, text in enumerate(md.read_text().splitlines(), 1):
            yield md, line, text
    for folder in CODE_FOLDERS:
        for py in sorted((ROOT / folder).rglob("*.py")):
            if py == Path(__file__).resolve():
                continue  # this file's prose describes the patterns it looks for
            for line, text in python_prose(py.read_text()):
                yield py, line, text
        for other in sorted([*(ROOT / folder).rglob("*.sh"), *(ROOT / folder).rglob("*.toml")]):
            for line, text in hash_comments(other.read_text()):
                yield other, line, text


def readme_headings() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.lstrip("#").strip().lower() for line in lines if line.startswith("#")]


def dangling(text: str, where: Path) -> list[str]:
    """The references in ``text`` (from file ``where``) to files or sections that do not exist."""
    missing = []
    for match in REPO_PATH.finditer(text):
        path = match.group()
        if text[match.end() : match.end() + 1] in PLACEHOLDER:
            path = path[: path.rfind("/") + 1]  # checked up to the placeholder
        path = path.rstrip(".-")  # the sentence's full stop, a dash
        if not (ROOT / path).exists():
            missing.append(path)
    if where.suffix == ".md":
        for target in MD_LINK.findall(text):
            if re.match(r"[a-z]+:|#", target):
                continue
            if not (where.parent / target.split("#")[0]).exists():
                missing.append(target)
    for name in CAPS_MD.findall(text):
        if not ((ROOT / name).exists() or (where.parent / name).exists()):
            missing.append(name)
    headings = readme_headings()
    for section in README_SECTION.findall(text):
        if not any(h.startswith(section.lower()) for h in headings):
            missing.append(f'README section "{section}"')
    return missing


def test_the_scanner_names_each_reference_that_does_not_exist(tmp_path):
    page = tmp_path / "page.md"
    text = (
        "Run `tools/no_such_tool.py`, see [the page](no-such-page.md), "
        'BACKGROUND.md §1 and README, "No Such Section"; '
        "`conformance/metrics.py`, [docs](page.md) and README.md exist."
    )
    page.write_text(text)
    assert dangling(text, page) == [
        "tools/no_such_tool.py",
        "no-such-page.md",
        "BACKGROUND.md",
        'README section "No Such Section"',
    ]


def test_docs_and_code_comments_reference_only_files_that_exist():
    found = [
        f"{where.relative_to(ROOT)}:{line}: {ref}"
        for where, line, text in prose()
        for ref in dangling(text, where)
    ]
    assert not found, "references to files not in the repository:\n" + "\n".join(found)
