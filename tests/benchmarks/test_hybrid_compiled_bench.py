"""`benchmarks.hybrid_compiled`'s pure parts: the servers' command lines and the table from a
small fake record set. No server."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import hybrid_compiled as hc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATHS = {"target": "/m/target", "domino": "/m/domino", "work": "/m"}


def test_only_the_compiled_servers_get_the_flag_and_only_domino_servers_a_draft():
    for name in hc.SERVERS:
        args = hc.server_args(name, PATHS, ["--tp-size", "2"])
        assert ("--enable-torch-compile" in args) == name.endswith(hc.COMPILED), name
        assert ("--speculative-draft-model-path" in args) == name.startswith("domino"), name
        assert args[args.index("--model-path") + 1] == "/m/target" and args[-2:] != ["--tp-size", "1"]
        assert "--sleep-on-idle" in args and "--tp-size" in args


def _run(server, rnd, conc, group, wall, tokens, steps=0, ids=((1, 2), (3, 4))):
    return dict(round=rnd, concurrency=conc, group=group, server=server, wall_s=wall, tokens=tokens,
                verify_steps=steps, output_ids=[list(x) for x in ids])


def test_the_table_puts_each_compiled_server_over_its_eager_twin_per_round():
    runs = []
    for rnd, (eager_wall, compiled_wall) in enumerate([(2.0, 1.0), (3.0, 2.0)]):
        for group in (0, 2):   # two groups of two requests
            runs += [_run("plain", rnd, 2, group, eager_wall, 10),
                     _run("plain, compiled", rnd, 2, group, compiled_wall, 10),
                     _run("domino", rnd, 2, group, eager_wall, 20, steps=4),
                     # one request of round 1 differs from its eager twin's
                     _run("domino, compiled", rnd, 2, group, compiled_wall, 20, steps=4,
                          ids=((1, 2), (3, 5)) if (rnd, group) == (1, 2) else ((1, 2), (3, 4)))]
    data = dict(machine={"cpu_model": "AMD EPYC", "cpu_count": 2},
                geometry=dict(layers=8, interval=4, hidden=128),
                settings=dict(rounds=2, concurrencies=[2], requests=4, prompt_len=24, max_new_tokens=2, tp_size=1,
                              servers=list(hc.SERVERS), command="python -m benchmarks.hybrid_compiled"),
                # requests 0 and 2 are (1, 2), 1 and 3 are (3, 4) in every server; the oracle's 3rd is (9, 9)
                oracle=[[1, 2], [3, 4], [9, 9], [3, 4]], startup_s={name: 10.0 for name in hc.SERVERS}, runs=runs)
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in hc.summarize(data) if line.startswith("| ")
             and not line.startswith("| server") and not line.startswith("|---")}
    # plain, compiled: 40 tokens over 6 s against 40 over 10 s; per round 2.0 and 1.5
    assert table["plain, compiled"][3:5] == ["1.67x", "2.00, 1.50"]
    assert table["plain"][3:5] == ["-", "-"] and table["plain"][5] == "1"
    assert table["plain, compiled"][6] == "yes" and table["plain"][6] == "-"
    assert table["domino, compiled"][5] == "5.00" and table["domino, compiled"][6] == "NO"
    assert table["plain"][7] == "3 of 4 |" and table["domino, compiled"][7] == "2 of 4 |"


@pytest.mark.parametrize("entry", ["hybrid-compiled-epyc", "hybrid-compiled-epyc-tp2"])
def test_the_committed_tables_are_their_records(entry):
    """The committed runs' tables recomputed from their records; every output the oracle's."""
    folder = os.path.join(ROOT, "benchmarks", "results", entry)
    with open(os.path.join(folder, "hybrid_compiled.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    with open(os.path.join(folder, "hybrid_compiled.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert text == "\n".join(hc.summarize(data)) + "\n"
    assert "| NO |" not in text   # every compiled server's outputs its eager twin's
