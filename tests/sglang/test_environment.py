"""The environment variables the plugin reads: one table (`environment.py`), at most three
names, one parser, the documentation's table equal to it, and the switches of earlier
releases refused with what replaced them."""

import ast
import os
import re

import pytest

from sglang_domino.sglang import environment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "sglang_domino")


def _string_constants(path):
    """Every string literal of a module that is not a docstring."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_but_the_table_names_a_variable_of_the_plugin():
    named = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py") and name != "environment.py":
                path = os.path.join(folder, name)
                for text in _string_constants(path):
                    for var in re.findall(r"SGLANG_DOMINO_[A-Z_]+", text):
                        named.setdefault(var, set()).add(os.path.relpath(path, ROOT))
    # messages may name a variable of the table (the kill switch, the debug list); none reads another
    declared = {var.name for var in environment.TABLE}
    assert set(named) <= declared, {k: v for k, v in named.items() if k not in declared}
    assert len(environment.TABLE) <= 3


def test_the_documented_table_is_the_modules():
    with open(os.path.join(ROOT, "docs", "plugin.md"), encoding="utf-8") as fh:
        assert environment.markdown_table() in fh.read()


def test_the_kill_switch_and_the_debug_list_are_parsed_once_and_checked():
    assert environment.disabled({"SGLANG_DOMINO_DISABLE": "1"}) and environment.disabled({"SGLANG_DOMINO_DISABLE": "on"})
    assert not environment.disabled({}) and not environment.disabled({"SGLANG_DOMINO_DISABLE": "0"})
    both = {"SGLANG_DOMINO_DEBUG": "q-rule-block, upstream-cpu-attention"}
    assert environment.debug("q-rule-block", both) and environment.debug("upstream-cpu-attention", both)
    assert not environment.debug("q-rule-block", {})
    with pytest.raises(ValueError, match="q-rule unknown; expected a comma-separated list of q-rule-block"):
        environment.debug("q-rule-block", {"SGLANG_DOMINO_DEBUG": "q-rule"})
    with pytest.raises(KeyError):
        environment.debug("no-such-check", {})


@pytest.mark.parametrize("name", sorted(environment.REMOVED))
def test_a_switch_of_an_earlier_release_is_refused_with_its_replacement(name):
    with pytest.raises(ValueError, match=f"{name} was removed: use {re.escape(environment.REMOVED[name][:20])}"):
        environment.refuse_removed({name: "1"})
    environment.refuse_removed({})
