"""`benchmarks.hybrid_replay`'s pure parts: the server-log parsing, the pool arithmetic checked
against logged lines, the budget inversion and the table from a small fake record set. No server."""

from __future__ import annotations

import copy
from dataclasses import asdict

from benchmarks import hybrid_replay as hr

LAYOUT = hr.pool_layout(hr.Geometry())

# lines as 0.5.23 and the plugin log them (a replay server: --max-mamba-cache-size 48, 16 running)
REPLAY_LOG = """\
[2026-12-02 15:31:40] Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.00GB, ssm_state size: \
0.04GB intermediate_ssm_state_cache size: 0.00GB intermediate_conv_window_cache size: 0.01GB 
[2026-12-02 15:31:40] GDN ReplaySSM ring buffers allocated (record_len=32, fold=False): d=0.003GB, k=0.002GB, \
g=0.000GB rawv=0.003GB, rawk=0.002GB, 
[2026-12-02 15:31:40] sglang-domino hybrid replay: GDN ReplaySSM verify for DFLASH, ring L=32 for a 16-token window \
over 17 request rows; per-position recurrent states: none (intermediate_ssm 0 bytes; snapshots would take 213909504 \
bytes, 12582912 per request row); replay rings 10131456 bytes (595968 per request row); checkpoint folded every \
commit (radix cache on)
[2026-12-02 15:31:40] max_total_num_tokens=4096, chunked_prefill_size=4096, max_prefill_tokens=16384, \
max_running_requests=16, context_len=4096, available_cpu_mem=19.50 GB
"""
# a snapshot server sized by a memory budget (no --max-mamba-cache-size)
SNAPSHOT_LOG = """\
[2026-12-02 15:34:01] max_running_requests is capped to 24 by the mamba state cache (max_mamba_cache_size=74, 3 state \
slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state \
size with --mamba-ssm-dtype bfloat16.
[2026-12-02 15:34:01] Mamba Cache is allocated. max_mamba_cache_size: 74, conv_state size: 0.00GB, ssm_state size: \
0.05GB intermediate_ssm_state_cache size: 0.29GB intermediate_conv_window_cache size: 0.01GB 
"""
PLAIN_LOG = ("[2026-12-02 15:29:05] Mamba Cache is allocated. max_mamba_cache_size: 48, conv_state size: 0.00GB, "
             "ssm_state size: 0.04GB \n")


def test_replay_log_lines_are_parsed():
    log = hr.parse_log(REPLAY_LOG)
    assert log["pool"] == dict(max_mamba_cache_size=48, conv_state_gb=0.0, ssm_state_gb=0.04, intermediate_ssm_gb=0.0,
                               intermediate_conv_window_gb=0.01)
    assert log["rings"]["record_len"] == 32 and log["rings"]["fold"] is False
    assert log["rings"]["parts_gb"] == dict(d=0.003, k=0.002, g=0.0, rawv=0.003, rawk=0.002)
    assert log["replay"] == dict(ring_len=32, window=16, rows=17, snapshot_bytes=213909504,
                                 snapshot_per_row=12582912, ring_bytes=10131456, ring_per_row=595968,
                                 folds="every commit (radix cache on)")
    assert log["totals"] == dict(max_total_num_tokens=4096, max_running_requests=16)
    assert "capped" not in log


def test_snapshot_and_plain_log_lines_are_parsed():
    log = hr.parse_log(SNAPSHOT_LOG)
    assert log["capped"] == dict(cap=24, max_mamba_cache_size=74, slots_per_request=3)
    assert log["pool"]["intermediate_ssm_gb"] == 0.29 and "replay" not in log and "rings" not in log
    plain = hr.parse_log(PLAIN_LOG)["pool"]
    assert plain["ssm_state_gb"] == 0.04 and plain["intermediate_ssm_gb"] is None


def test_the_layout_agrees_with_the_logged_pools():
    # the plugin's exact bytes for one request row
    assert LAYOUT["snapshot_per_row"] == 12582912 and LAYOUT["ring_per_row"] == 595968
    assert hr.check_log(hr.parse_log(REPLAY_LOG), LAYOUT, "replay", slots=49, rows=17) == []
    assert hr.check_log(hr.parse_log(SNAPSHOT_LOG), LAYOUT, "snapshot", slots=75, rows=25) == []
    assert hr.check_log(hr.parse_log(PLAIN_LOG), LAYOUT, "plain", slots=49, rows=17) == []
    # a pool of another size is caught
    assert hr.check_log(hr.parse_log(SNAPSHOT_LOG), LAYOUT, "snapshot", slots=75, rows=40)
    assert hr.check_log(hr.parse_log(REPLAY_LOG), LAYOUT, "replay", slots=49, rows=33)
    assert hr.check_log({}, LAYOUT, "plain", 1, 1) == ["no `Mamba Cache is allocated` line"]


def test_reserved_per_request():
    snap, rep = hr.reserved(LAYOUT, "snapshot", 3), hr.reserved(LAYOUT, "replay", 3)
    assert snap["state"] == rep["state"] == 3 * LAYOUT["state_per_slot"]
    assert snap["total"] - rep["total"] == LAYOUT["snapshot_per_row"] - LAYOUT["ring_per_row"]
    assert hr.reserved(LAYOUT, "plain", 3)["total"] == 3 * LAYOUT["state_per_slot"]


def test_budget_inversion_and_replay_fit():
    s, ring = LAYOUT["state_per_slot"], LAYOUT["ring_per_row"]
    budget = 0.5 * hr.GIB
    # 0.5.23's ratio-based pool sizes for that budget
    k_snap = int((budget - s * 17) // (s * (1 + 16 / 3)))
    k_rep = int((budget - ring * 257 - s) // s)
    for server, k in (("snapshot", k_snap), ("replay", k_rep)):
        inferred = hr.budget_from_pool(server, k, s, 16, 3, ring, 256)
        assert inferred <= budget and budget - inferred < s * (1 + 16 / 3)
    m = hr.replay_fixed_point(budget, s, ring, 3)
    assert ((budget - ring * (m + 1) - s) // s) // 3 >= m
    assert ((budget - ring * (m + 2) - s) // s) // 3 < m + 1
    assert m > 4 * (k_snap // 3)


def _request(ids, verify):
    return dict(output_ids=ids, completion_tokens=len(ids), verify_ct=verify, e2e_latency=0.5)


def fake_data():
    prompts, oracle = [[1, 2], [3, 4]], [[300, 301, 300, 300], [301, 301, 300, 301]]
    runs = []
    for rnd in range(2):
        for server, wall, verify, cap, k in (("plain", 2.0, 0, 4, 12), ("snapshot", 1.0, 2, 4, 12),
                                             ("replay", 0.8, 2, 4, 12)):
            conc = {str(c): dict(wall_s=wall * (1 + rnd * 0.1), requests=[_request(o, verify) for o in oracle])
                    for c in (1, 2)}
            runs.append(dict(round=rnd, server=server, server_info=dict(cap=cap, max_mamba_cache_size=k),
                             concurrency=conc, log_check=[]))
    probes = [dict(round=0, kind="snapshot", max_running_requests=256, budget_bytes=0.5 * hr.GIB,
                   server_info=dict(cap=13, max_mamba_cache_size=40)),
              dict(round=0, kind="replay", max_running_requests=256, budget_bytes=0.5 * hr.GIB,
                   server_info=dict(cap=46, max_mamba_cache_size=138)),
              dict(round=0, kind="replay-fit", max_running_requests=60, budget_bytes=0.5 * hr.GIB,
                   server_info=dict(cap=60, max_mamba_cache_size=190))]
    data = dict(machine=dict(cpu="Fake CPU", cpu_count=2), geometry=asdict(hr.Geometry()), layout=LAYOUT,
                settings=dict(rounds=2, concurrencies=[1, 2], requests=2, prompt_len=2, max_new_tokens=4,
                              dtype="float32", ring_len=32, max_mamba_cache_size=12, max_running_requests=4,
                              common_args=["--max-mamba-cache-size", "12"],
                              command="python -m benchmarks.hybrid_replay"),
                prompts=prompts, oracle=oracle, runs=runs, probes=probes,
                budget=dict(budget_gb=1.0, mem_fraction_static=0.05))
    data["mismatches"] = hr.mismatches(runs, oracle)
    return data


def test_the_table_from_fake_records():
    data = fake_data()
    text = "\n".join(hr.summarize(data))
    assert "Fake CPU, 2 cores" in text and "float32" in text and "concurrency 1, 2" in text
    # memory rows: same cap, 3 slots per request, the speculative terms
    assert "| snapshot | 4 | 3 | 2,469,888 B | 12,582,912 B | — | 589,824 B | 15,642,624 B |" in text
    assert "| replay | 4 | 3 | 2,469,888 B | 0 B | 595,968 B | 589,824 B | 3,655,680 B |" in text
    assert "| plain | 4 | 3 | 2,469,888 B | — | — | — | 2,469,888 B |" in text
    assert "0.047x (595,968 B against 12,582,912 B)" in text
    # budget: caps per GiB, replay at its fit against snapshot
    assert "| snapshot | 256 | 40 | 13 | 0.500 GiB | 26.0 |" in text
    assert "| replay, --max-running-requests at its fit | 60 | 190 | 60 | 0.500 GiB | 120.0 |" in text
    assert "cap per GiB of mamba budget: 4.62x (replay at the same --max-running-requests: 3.54x)" in text
    # speed: medians over the two rounds (walls 1.0 and 1.1 for snapshot: 8 tokens, 4 verifies)
    def tps(wall):
        return (8 / wall + 8 / (1.1 * wall)) / 2

    assert f"| 1 | {tps(2.0):.1f} | {tps(1.0):.1f} | {tps(0.8):.1f} | 1.25x |" in text
    assert "| 2.00 / 2.00 |" in text
    assert "Outputs: 0 of 24 requests differ from the plain server's first run, 0 from Transformers'" in text


def test_a_changed_output_is_counted():
    data = fake_data()
    runs = copy.deepcopy(data["runs"])
    runs[4]["concurrency"]["2"]["requests"][1]["output_ids"] = [301, 301, 300, 300]
    mm = hr.mismatches(runs, data["oracle"])
    assert mm["vs_plain"] == 1 and mm["vs_transformers"] == 1
    assert mm["detail"] == [dict(round=1, server="snapshot", concurrency="2", request=1)]


def test_step_time_and_accept_length():
    run = dict(wall_s=2.0, requests=[_request([1] * 10, 3), _request([1] * 10, 5)])
    stats = hr.conc_stats(run, "snapshot", 2)
    assert stats["tok_per_s"] == 10 and stats["step_ms"] == 1000 * 2.0 * 2 / 8 and stats["accept_len"] == 20 / 8
    plain = hr.conc_stats(run, "plain", 1)
    assert plain["step_ms"] == 1000 * 2.0 / 18 and "accept_len" not in plain


def test_the_table_is_rewritten_from_the_json_alone(tmp_path, capsys):
    import json

    record = tmp_path / "hybrid_replay.json"
    record.write_text(json.dumps(fake_data()))
    hr.main(["--from-json", str(record), "--out", str(tmp_path / "md")])
    text = (tmp_path / "md" / "hybrid_replay.md").read_text()
    assert text == "\n".join(hr.summarize(json.loads(record.read_text()))) + "\n"
    assert "## Concurrency cap under a memory budget" in text
