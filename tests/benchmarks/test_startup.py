"""`benchmarks/startup.py` without a server: what it reads from a server's log, its table,
and the committed run's table recomputed from its records."""

import json
import os

from benchmarks import startup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED = os.path.join(ROOT, "benchmarks", "results", "startup-epyc-2026-12-06")

LOG = """[2026-12-06 02:19:50] sglang-domino: the CPU scheduler processes forked from the launching process
[2026-12-06 02:19:57] --enable-torch-compile: the target's 6 layers compiled in 3.9 s (compile cache /c)
[2026-12-06 02:19:59] --enable-torch-compile: the draft's 2 layers compiled in 2.0 s (compile cache /c)
[2026-12-06 02:20:02] sglang-domino warm-up: the compiled Domino rollout at blocks [16, 8] in 2.1 s
[2026-12-06 02:20:02] Engine startup timings (s): load_weight=0.08, kv_cache_allocation=0.58, scheduler_e2e=7.66, x=1
"""


def test_the_log_gives_the_graphs_times_and_how_the_children_started():
    assert startup.read_log(LOG) == {"target graphs": 3.9, "draft graphs": 2.0, "rollout graphs": 2.1,
                                     "children": "forked", "scheduler_s": 7.66}
    eager = "sglang-domino: the CPU scheduler processes spawned as 0.5.23 does: SGLANG_DOMINO_DEBUG=..."
    assert startup.read_log(eager) == {"children": "spawned"}
    assert startup.read_log("") == {"children": "not logged"}


def test_the_table_gives_each_servers_median_and_every_start():
    runs = {"cpu": "a CPU", "date": "2026-12-06", "command": "sglang serve x", "commit": "abc", "rounds": 3,
            "configs": ["eager, forked", "compiled, forked"],
            "imports": [12.0, 11.0, 13.5],
            "starts": [{"config": "eager, forked", "health_s": h, "first_token_s": h + 1, "children": "forked",
                        "scheduler_s": h - 10} for h in (15.0, 14.0, 20.0)]
            + [{"config": "compiled, forked", "health_s": h, "first_token_s": h + 0.5, "children": "forked",
                "target graphs": 4.0, "draft graphs": 2.0, "rollout graphs": 2.0} for h in (25.0, 27.0, 26.0)]}
    text = startup.summarize(runs)
    assert "| eager, forked | 15.0 | 16.0 | 15.0, 14.0, 20.0 | 5.0 | forked |" in text
    assert "| compiled, forked | 26.0 | 26.5 | 25.0, 27.0, 26.0 | - | forked |" in text   # no timings line
    assert "median 12.0 s (12.0, 11.0, 13.5)" in text
    assert "target graphs 4.0, draft graphs 2.0, rollout graphs 2.0" in text


def test_the_committed_table_is_its_records():
    with open(os.path.join(COMMITTED, "runs.json"), encoding="utf-8") as fh:
        runs = json.load(fh)
    with open(os.path.join(COMMITTED, "startup.md"), encoding="utf-8") as fh:
        assert fh.read() == startup.summarize(runs)
    # every server its configured number of times, the default one forked
    for name in runs["configs"]:
        mine = [s for s in runs["starts"] if s["config"] == name]
        assert len(mine) == runs["rounds"]
        assert {s["children"] for s in mine} == {"spawned" if "spawned" in name else "forked"}
