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
    """docs/architecture.md's tables name every module of `sglang_domino/sglang/` and of each
    of its folders, so the page cannot drift from the tree."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as fh:
        page = fh.read()
    package = os.path.join(ROOT, "sglang_domino", "sglang")
    missing = [os.path.relpath(os.path.join(folder, name), package)
               for folder, _, names in os.walk(package) if "__pycache__" not in folder
               for name in sorted(names)
               if name.endswith(".py") and name != "__init__.py" and f"`{name}`" not in page]
    assert not missing, missing


def _upstream_root() -> str:
    """The installed SGLang's package folder, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    return os.path.dirname(spec.origin) if spec and spec.origin else ""


CODE_PATH = re.compile(r"`((?:[\w.]+/)*[\w.]+\.py)`")


@pytest.mark.parametrize("page", PAGES + [os.path.join("sglang_domino", "sglang", "seam", "UPSTREAM.md")])
def test_every_python_file_a_page_names_exists(page):
    """A `path.py` in backticks is a file of this tree (from the root, `sglang_domino/` or the
    plugin's package) or of the installed SGLang; a bare `name.py` is some file's name. So a
    module that moves or is renamed cannot leave its old name behind in the docs."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        text = fh.read()
    upstream = _upstream_root()
    roots = [ROOT, os.path.join(ROOT, "sglang_domino"), os.path.join(ROOT, "sglang_domino", "sglang"),
             os.path.join(ROOT, "sglang_domino", "sglang", "cpu"), upstream, os.path.join(upstream, "srt")]
    bases = [os.path.join(ROOT, d) for d in ("sglang_domino", "kernels", "tests", "benchmarks", "scripts", "docker")]
    names = {n for base in bases + [upstream] if base for _, _, files in os.walk(base) for n in files}
    missing = []
    for path in set(CODE_PATH.findall(text)):
        if "/" in path:
            found = any(os.path.exists(os.path.join(r, path)) for r in roots if r) or \
                any(os.path.exists(os.path.join(upstream, d, path)) for d in ("srt", "kernels") if upstream)
        else:
            found = path in names
        if not found:
            missing.append(path)
    assert not missing, f"{page}: {sorted(missing)}"
