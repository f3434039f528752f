"""The front page stays a five-minute read and every relative link in it and in docs/
leads somewhere (a file of the tree, and a heading of that file where it names one)."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                         if f.endswith(".md")]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    out = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("#"):
                text = line.lstrip("#").strip().lower()
                out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def test_the_readme_is_at_most_150_lines():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        assert len(fh.read().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        text = fh.read()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        if not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(target)
    assert not broken, f"{page}: {broken}"


def test_the_architecture_page_lists_every_module_of_the_plugin():
    """docs/architecture.md's tables name every module of `sglang_domino/sglang/` and its
    `cpu/` folder, so the page cannot drift from the tree."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as fh:
        page = fh.read()
    package = os.path.join(ROOT, "sglang_domino", "sglang")
    missing = [os.path.relpath(os.path.join(folder, name), package)
               for folder in (package, os.path.join(package, "cpu"))
               for name in sorted(os.listdir(folder))
               if name.endswith(".py") and name != "__init__.py" and f"`{name}`" not in page]
    assert not missing, missing
