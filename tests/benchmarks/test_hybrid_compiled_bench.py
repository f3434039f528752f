"""`benchmarks.hybrid_compiled`'s pure parts: the servers' command lines and the table from a
small fake record set. No server."""

from __future__ import annotations

from benchmarks import hybrid_compiled as hc

PATHS = {"target": "/m/target", "domino": "/m/domino", "work": "/m"}


def test_only_the_compiled_servers_get_the_flag_and_only_domino_servers_a_draft():
    for name in hc.SERVERS:
        args = hc.server_args(name, PATHS, ["--tp-size", "2"])
        assert ("--enable-torch-compile" in args) == name.endswith(hc.COMPILED), name
        assert ("--speculative-draft-model-path" in args) == name.startswith("domino"), name
        assert args[args.index("--model-path") + 1] == "/m/target" and args[-2:] != ["--tp-size", "1"]
        assert "--sleep-on-idle" in args and "--tp-size" in args


def _run(server, rnd, conc, group, wall, tokens, steps=0, equal=True):
    return dict(round=rnd, concurrency=conc, group=group, server=server, wall_s=wall, tokens=tokens,
                verify_steps=steps, outputs_equal_oracle=equal)


def test_the_table_puts_each_compiled_server_over_its_eager_twin_per_round():
    runs = []
    for rnd, (eager_wall, compiled_wall) in enumerate([(2.0, 1.0), (3.0, 2.0)]):
        for group in (0, 1):
            runs += [_run("plain", rnd, 1, group, eager_wall, 10), _run("plain, compiled", rnd, 1, group, compiled_wall, 10),
                     _run("domino", rnd, 1, group, eager_wall, 20, steps=4),
                     _run("domino, compiled", rnd, 1, group, compiled_wall, 20, steps=4, equal=group == 0)]
    data = dict(machine={"cpu_model": "AMD EPYC", "cpu_count": 2},
                geometry=dict(layers=8, interval=4, hidden=128),
                settings=dict(rounds=2, concurrencies=[1], requests=2, prompt_len=24, max_new_tokens=10, tp_size=1,
                              servers=list(hc.SERVERS), command="python -m benchmarks.hybrid_compiled"),
                startup_s={name: 10.0 for name in hc.SERVERS}, runs=runs)
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in hc.summarize(data) if line.startswith("| ")
             and not line.startswith("| server") and not line.startswith("|---")}
    # plain, compiled: 40 tokens over 6 s against 40 over 10 s; per round 2.0 and 1.5
    assert table["plain, compiled"][3:5] == ["1.67x", "2.00, 1.50"]
    assert table["plain"][3:5] == ["-", "-"] and table["plain"][5] == "1"
    assert table["domino, compiled"][5] == "5.00" and table["domino, compiled"][6] == "NO |"
    assert table["domino"][6] == "yes |"
