"""benchmarks/results/README.md is what `python -m benchmarks.results_index` writes, it has a row
for every entry of benchmarks/results, and every `benchmarks/results/...` path the docs cite exists:
in the tree, or, quoted after a git revision (`git show REV:benchmarks/results/...`, how the
results log names a superseded run that has left the tree), at that revision."""

import dataclasses
import itertools
import json
import os
import re
import subprocess

import pytest

from benchmarks import results_index

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGES = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                         if f.endswith(".md")]
# A results path, with the git revision it is quoted at (`REV:benchmarks/results/...`) where there is one.
CITED = re.compile(r"(?:\b([0-9a-f]{7,40}):)?(benchmarks/results/[\w.\-/{},]*)")


def _git_history() -> bool:
    """The dates come from `git log`: without the history (an image, a shallow clone) they cannot match."""
    try:
        proc = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "false"


def _index_rows() -> list[str]:
    with open(os.path.join(RESULTS, results_index.INDEX_NAME), encoding="utf-8") as fh:
        return re.findall(r"^\| \[([^\]]+)\]\(", fh.read(), re.M)


@pytest.mark.skipif(not _git_history(), reason="no git history here to date the entries")
def test_the_committed_index_is_what_the_script_writes(capsys):
    assert results_index.main(["--check"]) == 0, capsys.readouterr().out[-6000:]


def test_every_entry_of_the_results_has_one_row():
    entries = sorted(e for e in os.listdir(RESULTS) if e != results_index.INDEX_NAME and not e.startswith("."))
    assert _index_rows() == entries


def _expand(path: str) -> list[str]:
    """`testbed.{json,md}` -> testbed.json, testbed.md."""
    parts = re.split(r"\{([^{}]*)\}", path)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(chosen) for chosen in itertools.product(*options)]


def _cited(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The results paths `text` cites: those in the tree, and (revision, path) for those it
    quotes at a git revision (`git show REV:path`), which need not be in the tree."""
    in_tree, at_revision = set(), set()
    for rev, path in CITED.findall(text):
        path = path.rstrip(".,;:")
        if rev:
            at_revision.add((rev, path))
        else:
            in_tree.add(path)
    return in_tree, at_revision


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return fh.read()


def test_a_path_quoted_at_a_git_revision_is_not_looked_for_in_the_tree():
    text = ("Records: [here](../benchmarks/results/here/interleaved_ab.md), "
            "`git show bda4a0e:benchmarks/results/gone/interleaved_ab.md`; "
            "`git show 0123456789abcdef0123456789abcdef01234567:benchmarks/results/gone-too/`.\n"
            "Not a revision: note:benchmarks/results/kept/, zbda4a0e:benchmarks/results/also-kept.json.")
    in_tree, at_revision = _cited(text)
    assert in_tree == {"benchmarks/results/here/interleaved_ab.md", "benchmarks/results/kept/",
                       "benchmarks/results/also-kept.json"}
    assert at_revision == {("bda4a0e", "benchmarks/results/gone/interleaved_ab.md"),
                           ("0123456789abcdef0123456789abcdef01234567", "benchmarks/results/gone-too/")}


@pytest.mark.parametrize("page", PAGES)
def test_every_results_path_the_docs_cite_exists(page):
    in_tree, _ = _cited(_read(page))
    missing = [p for c in sorted(in_tree) for p in _expand(c)
               if p.rstrip("/") != "benchmarks/results" and not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"{page}: {missing}"


@pytest.mark.skipif(not _git_history(), reason="no git history here to look the revisions up in")
@pytest.mark.parametrize("page", PAGES)
def test_every_results_path_the_docs_quote_at_a_git_revision_is_there(page):
    """A superseded run that has left the tree is still at the revision the docs quote it at."""
    _, at_revision = _cited(_read(page))
    missing = [f"{rev}:{p}" for rev, c in sorted(at_revision) for p in _expand(c)
               if subprocess.run(["git", "cat-file", "-e", f"{rev}:{p}"], cwd=ROOT, capture_output=True,
                                 timeout=60).returncode != 0]
    assert not missing, f"{page}: {missing}"


def test_a_row_takes_its_fields_from_the_entry_and_says_what_is_not_recorded(tmp_path):
    run = tmp_path / "some-run"
    run.mkdir()
    (run / "interleaved_ab.md").write_text(
        "# Served side by side\n\nTest bed. CPU: AMD EPYC (family 23; AVX2, no AVX-512, no AMX), 2 cores. "
        "Command: `python -m benchmarks.interleaved_ab --rounds 2 --servers plain \"width 16\"`.\n")
    row = results_index.row("some-run", results=tmp_path, root=tmp_path)
    assert row.question == "Served side by side"            # no curated question: the entry's title
    assert row.command == '`python -m benchmarks.interleaved_ab --rounds 2 --servers plain "width 16"`'
    assert row.cpu == "AMD EPYC (family 23; AVX2, no AVX-512, no AMX), 2 cores"
    assert row.link == "some-run/interleaved_ab.md"

    (tmp_path / "bare.json").write_text(json.dumps({"records": []}))
    bare = results_index.row("bare.json", results=tmp_path, root=tmp_path)
    assert (bare.command, bare.cpu, bare.question) == ("not recorded",) * 3

    (tmp_path / "policy_cost.json").write_text(json.dumps({"machine": {
        "cpu": "Intel(R) Xeon(R) Processor", "cpu_count": 2, "cpu_family": "6",
        "simd": ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]}, "records": []}))
    cost = results_index.row("policy_cost.json", results=tmp_path, root=tmp_path)
    assert cost.command == "`python -m benchmarks.policy_cost`, arguments not recorded"
    assert cost.cpu == "Intel(R) Xeon(R) Processor (family 6; AVX2, AVX-512 with bf16, AMX), 2 cores"
    # a table cell cannot hold a bare '|'
    assert "`a \\| b`" in results_index.render([dataclasses.replace(row, command="`a | b`")])
