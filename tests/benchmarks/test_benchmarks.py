"""Benchmark plumbing: task loading, records -> summary -> recompute, the HF script end to
end on tiny checkpoints, the SGLang script's failure paths."""

import json
import os
import subprocess
import sys
import types

import pytest

from benchmarks import report
from benchmarks.records import Record, read, write
from benchmarks.tasks import TASKS, TaskNotFound, load_prompts, parse_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_parse_tasks():
    assert parse_tasks("gsm8k:128, humaneval:2") == [("gsm8k", 128), ("humaneval", 2)]
    for bad, needle in [("gsm9k:3", "unknown task 'gsm9k'"), ("gsm8k", "needs a positive count"),
                        ("gsm8k:x", "'x' of 'gsm8k' is not an integer"), ("", "expected a list")]:
        with pytest.raises(ValueError, match=needle):
            parse_tasks(bad)
    assert set(TASKS) >= {"gsm8k", "math500", "aime24", "aime25", "humaneval", "mbpp", "livecodebench",
                          "swe-bench", "mt-bench", "alpaca"}


def test_humaneval_ships_with_the_package():
    prompts = load_prompts("humaneval", 500)
    assert len(prompts) == 164 and "def has_close_elements" in prompts[0]


def test_missing_task_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("BENCH_DATA_DIR", raising=False)
    monkeypatch.delenv("MT_BENCH_PATH", raising=False)
    with pytest.raises(TaskNotFound, match="Set MT_BENCH_PATH to a .jsonl file"):
        load_prompts("mt-bench", 3)
    monkeypatch.setenv("MT_BENCH_PATH", str(tmp_path / "nope.jsonl"))
    with pytest.raises(TaskNotFound, match="does not exist"):
        load_prompts("mt-bench", 3)


def test_user_files_take_templates_or_finished_prompts(monkeypatch, tmp_path):
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"question": "1+1?"}) + "\n" + json.dumps({"question": "2+2?"}) + "\n")
    monkeypatch.setenv("BENCH_DATA_DIR", str(tmp_path))
    prompts = load_prompts("gsm8k", 5)
    assert len(prompts) == 2 and prompts[0].startswith("1+1?\nPlease reason step by step")
    finished = tmp_path / "alpaca.jsonl"
    finished.write_text(json.dumps({"prompt": "say hi"}) + "\n")
    monkeypatch.setenv("ALPACA_PATH", str(finished))
    assert load_prompts("alpaca", 1) == ["say hi"]


def make_records():
    recs = []
    for method, rate, steps in [("target-only", 10.0, 0), ("dflash", 20.0, 4), ("domino", 25.0, 3)]:
        for task in ("gsm8k", "humaneval"):
            for conc in (1, 2):
                for repeat in range(2):
                    for i in range(conc):
                        tokens = 40
                        dur = tokens / (rate * (1.1 if repeat else 1.0))
                        recs.append(Record(backend="sglang", method=method, task=task, concurrency=conc, repeat=repeat,
                                           prompt_index=i, prompt_tokens=12, completion_tokens=tokens, verify_steps=steps * 3,
                                           accepted_tokens=tokens if steps else 0, start_s=0.0, end_s=dur,
                                           latency_s=dur, tok_per_s=tokens / dur))
    return recs


def test_summary_cells_and_recompute_check(tmp_path):
    path = tmp_path / "records.jsonl"
    write(str(path), make_records(), append=False)
    assert len(read(str(path))) == len(make_records())
    assert report.main([str(path), "--out", str(tmp_path), "--title", "unit"]) == 0
    summary = (tmp_path / "summary.md").read_text()
    # concurrency 2: two 40-token requests side by side, each at 10 tok/s (repeat 0) or 11 tok/s
    # (repeat 1), make 20 and 22 tok/s for target-only: 21 ± 1; DFlash runs twice as fast.
    assert "| gsm8k | 21.0 ± 1.0 (1.00×) | 42.0 ± 2.0 (2.00×) | 52.5 ± 2.5 (2.50×) |" in summary
    assert "| **macro speedup** | 1.00× | 2.00× | 2.50× |" in summary
    assert "| humaneval | 1 | 3.33 | 4.44 |" in summary        # 40 tokens / 12 (or 9) verify steps
    assert {"speedup_c1.png", "speedup_c2.png", "accept_length_c1.png", "accept_length_c2.png"} <= set(os.listdir(tmp_path))
    assert report.main([str(path), "--check", str(tmp_path / "summary.md")]) == 0
    (tmp_path / "summary.md").write_text(summary.replace("2.50×", "2.60×"))
    assert report.main([str(path), "--check", str(tmp_path / "summary.md")]) == 1


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    from sglang_domino.testing import save_tiny_draft, save_tiny_target

    root = tmp_path_factory.mktemp("ckpt")
    target = save_tiny_target(str(root / "target"))
    save_tiny_draft(str(root / "dflash"), target, "dflash")
    save_tiny_draft(str(root / "domino"), target, "domino")
    return root


def run_script(script, env_extra, timeout=600):
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", **env_extra}
    return subprocess.run([os.path.join(ROOT, script)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_hf_benchmark_script_end_to_end(tiny_checkpoints, tmp_path):
    out = tmp_path / "hf"
    proc = run_script("run_hf_benchmark.sh", {
        "TARGET_MODEL": str(tiny_checkpoints / "target"),
        "DRAFT_MODEL": f"{tiny_checkpoints / 'dflash'},{tiny_checkpoints / 'domino'}",
        "TASKS": "humaneval:2", "MAX_NEW_TOKENS": "8", "OUT_DIR": str(out), "BLOCK_SIZE": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read(str(out / "records.jsonl"))
    assert {r.method for r in records} == {"target-only", "dflash", "domino"}
    assert all(r.completion_tokens == 8 for r in records)
    assert all(r.verify_steps > 0 for r in records if r.method != "target-only")
    assert report.main([str(out / "records.jsonl"), "--check", str(out / "summary.md")]) == 0
    assert (out / "speedup_c1.png").stat().st_size > 1000


def test_hf_benchmark_shards_write_where_the_launcher_reads(monkeypatch, tmp_path):
    """Without OUT_DIR the launcher names a timestamped directory; a shard started a second
    later must still write into it (it used to derive its own name from the clock)."""
    from benchmarks import hf_bench, settings

    ticks = iter(range(100))
    monkeypatch.setattr(settings.time, "strftime", lambda fmt: fmt.replace("%Y%m%d-%H%M%S", f"t{next(ticks)}"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    for name, value in {"TARGET_MODEL": "t", "DRAFT_MODEL": "d", "TASKS": "gsm8k:1", "NUM_GPUS": "1",
                        "GSM8K_PATH": str(tmp_path / "p.jsonl")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OUT_DIR", raising=False)

    class Shard:   # what a shard process does with the environment it is given
        def __init__(self, args, env):
            self.args = args
            cfg = hf_bench.HFBenchConfig.from_env(env)
            os.makedirs(cfg.out_dir, exist_ok=True)
            write(os.path.join(cfg.out_dir, f"records.shard{args[4]}.jsonl"), [Record(
                backend="hf", method="target-only", task="gsm8k", concurrency=1, repeat=0, prompt_index=0,
                prompt_tokens=1, completion_tokens=4, verify_steps=0, accepted_tokens=0, start_s=0.0, end_s=1.0,
                latency_s=1.0, tok_per_s=4.0)])

        def wait(self):
            return 0

    monkeypatch.setattr(hf_bench, "subprocess", types.SimpleNamespace(Popen=Shard))
    assert hf_bench.main([]) == 0
    (out,) = list((tmp_path / "benchmarks" / "results").iterdir())
    assert len(read(str(out / "records.jsonl"))) == 1


def test_hf_benchmark_rejects_bad_tasks(tiny_checkpoints, tmp_path):
    proc = run_script("run_hf_benchmark.sh", {"TARGET_MODEL": str(tiny_checkpoints / "target"),
                                              "DRAFT_MODEL": str(tiny_checkpoints / "dflash"), "TASKS": "gsm8k:2,mbpq:3",
                                              "OUT_DIR": str(tmp_path / "x")})
    assert proc.returncode != 0 and "unknown task 'mbpq'" in proc.stderr


def test_sglang_benchmark_reports_a_server_that_never_comes_up(tiny_checkpoints, tmp_path):
    proc = run_script("run_sglang_benchmark.sh", {
        "TARGET_MODEL": str(tiny_checkpoints / "target"), "DRAFT_MODEL": str(tiny_checkpoints / "dflash"),
        "TASKS": "humaneval:1", "CONCURRENCIES": "1", "OUT_DIR": str(tmp_path / "s"),
        "SERVER_ARGS": "--no-such-flag", "SERVER_TIMEOUT": "120"})
    assert proc.returncode == 1
    assert "server exited with code" in proc.stderr and "before becoming healthy" in proc.stderr


def test_sglang_benchmark_rejects_bad_settings(tiny_checkpoints, tmp_path):
    base = {"TARGET_MODEL": str(tiny_checkpoints / "target"), "DRAFT_MODEL": str(tiny_checkpoints / "dflash"),
            "OUT_DIR": str(tmp_path / "s")}
    proc = run_script("run_sglang_benchmark.sh", {**base, "TASKS": "alpacca:3"})
    assert proc.returncode != 0 and "unknown task 'alpacca'" in proc.stderr
    proc = run_script("run_sglang_benchmark.sh", {**base, "TASKS": "humaneval:1", "VERIFY_TOKENS": "32"})
    assert proc.returncode != 0 and "VERIFY_TOKENS: got 32, expected at most BLOCK_SIZE=16" in proc.stderr
    proc = run_script("run_sglang_benchmark.sh", {**base, "TASKS": "humaneval:1", "RULES": "qq"})
    assert proc.returncode != 0 and "RULES: got 'qq', expected one of ['both', 'point', 'q']" in proc.stderr


def test_sglang_benchmark_rules_add_a_q_method_for_domino_drafts(tiny_checkpoints, monkeypatch):
    """RULES=both: each Domino draft also runs with --speculative-use-rejection-sampling
    (method `<draft>+q`); a plain DFlash draft keeps only the point-mass rule."""
    from benchmarks.sglang_bench import Q_FLAG, SGLangBenchConfig

    env = {"TARGET_MODEL": str(tiny_checkpoints / "target"), "TASKS": "humaneval:1", "RULES": "both",
           "DRAFT_MODEL": f"{tiny_checkpoints / 'dflash'},{tiny_checkpoints / 'domino'}"}
    cfg = SGLangBenchConfig.from_env(env)
    methods = cfg.methods()
    assert list(methods) == ["target-only", "dflash", "domino", "domino+q"]
    draft, extra = methods["domino+q"]
    cmd = cfg.launch_command(8000, draft, tuple(extra))
    assert cmd.count(Q_FLAG) == 1 and methods["domino"][1] == []
    assert list(SGLangBenchConfig.from_env({**env, "RULES": "q"}).methods()) == ["target-only", "domino+q"]


def test_sglang_benchmark_widths_give_one_method_per_draft_and_width(tiny_checkpoints):
    """WIDTHS=16,8,adaptive: `<draft>` at the block, `<draft>-w8`, `<draft>-adaptive`, each
    server launched with only its own width flag."""
    from benchmarks.sglang_bench import SGLangBenchConfig

    env = {"TARGET_MODEL": str(tiny_checkpoints / "target"), "TASKS": "humaneval:1", "WIDTHS": "16,8,adaptive",
           "DRAFT_MODEL": f"{tiny_checkpoints / 'dflash'},{tiny_checkpoints / 'domino'}"}
    cfg = SGLangBenchConfig.from_env(env)
    methods = cfg.methods()
    assert list(methods) == ["target-only", "dflash", "dflash-w8", "dflash-adaptive", "domino", "domino-w8",
                             "domino-adaptive"]
    assert methods["domino"][1] == [] and methods["domino-w8"][1] == ["--speculative-num-draft-tokens", "8"]
    cmd = cfg.launch_command(8000, *methods["dflash-adaptive"][:1], tuple(methods["dflash-adaptive"][1]))
    assert "--speculative-adaptive" in cmd and "--speculative-num-draft-tokens" not in cmd
    with pytest.raises(SystemExit, match="WIDTHS: got '1'"):
        SGLangBenchConfig.from_env({**env, "WIDTHS": "16,1"})


def test_report_compares_adaptive_with_the_best_fixed_width(tmp_path):
    """The summary's adaptive section divides by the best rival at each concurrency, and the
    throughput plot is written when there are several concurrencies."""
    from benchmarks.records import Record
    from benchmarks.report import plot, summarize

    def run(method, conc, tokens_per_s):
        return [Record(backend="sglang", method=method, task="t", concurrency=conc, repeat=0, prompt_index=0,
                       prompt_tokens=4, completion_tokens=int(tokens_per_s), verify_steps=1 if method != "target-only" else 0,
                       accepted_tokens=int(tokens_per_s) if method != "target-only" else 0, start_s=0.0, end_s=1.0,
                       latency_s=1.0, tok_per_s=tokens_per_s)]

    records = (run("target-only", 1, 100) + run("d", 1, 300) + run("d-w8", 1, 250) + run("d-adaptive", 1, 290)
               + run("target-only", 8, 400) + run("d", 8, 380) + run("d-w8", 8, 500) + run("d-adaptive", 8, 520))
    text = summarize(records)
    assert "| t | 1 | 0.97× (d) |" in text and "| t | 8 | 1.04× (d-w8) |" in text
    files = plot(records, str(tmp_path))
    assert str(tmp_path / "throughput_t.png") in files and (tmp_path / "throughput_t.png").stat().st_size > 0


def test_gpu_check_script_smoke_runs_on_cpu():
    """The H200 check script at tiny sizes: every piece runs and agrees with its reference."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--small", "--repeats", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("PASS") and "[rollout] domino sampled bs=32" in proc.stdout
    # section 5, the per-step tails: captured on CUDA, on CPU the stand-in (the same code, rerun)
    graph = [line for line in proc.stdout.splitlines() if line.startswith("[graph] ")]
    for tail in ("domino greedy", "domino sampled", "q-rule sampler", "chain_accept K=64"):
        ran = [line for line in graph if line.startswith(f"[graph] {tail} ")]
        assert ran and all("(CPU: no graph captured)" in line and line.endswith("ok=True") for line in ran), graph


@pytest.mark.parametrize("run", ["hf-testbed", "sglang-testbed", "sglang-testbed-b8", "sglang-testbed-bf16",
                                 "sglang-testbed-t1.0", "sglang-testbed-t0.6", "sglang-testbed-accept-t1.0",
                                 "sglang-testbed-accept-t0.6", "sglang-testbed-adaptive-float32",
                                 "sglang-testbed-adaptive-bfloat16"])
def test_checked_in_results_reproduce_from_their_records(run):
    folder = os.path.join(ROOT, "benchmarks", "results", run)
    assert report.main([os.path.join(folder, "records.jsonl"), "--check", os.path.join(folder, "summary.md")]) == 0


def test_numerics_comparison_finds_the_first_differing_token():
    from benchmarks.sglang_numerics import compare, first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2          # one output stops early
    r = compare([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 0], [7]])
    assert r == {"requests": 3, "differ": 2, "first_difference": [1, 0], "median_first_difference": 1}


def test_cpu_attention_benchmark_smoke(tmp_path):
    """`python -m benchmarks.cpu_attention` at toy sizes writes its records and table (no
    timing is checked)."""
    pytest.importorskip("sglang")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cpu_attention", "--rounds", "1", "--reps", "1",
                           "--contexts", "8", "--batch-sizes", "1", "2", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads((tmp_path / "cpu_attention.json").read_text())["records"]
    assert len(records) == 4 and all(r["batched_ms"] > 0 for r in records)
    assert "| verify (16 rows, causal) | 2 | 8 |" in (tmp_path / "cpu_attention.md").read_text()


def test_interleaved_ab_rates_each_server_over_its_own_wall_time():
    from benchmarks.interleaved_ab import summary

    def group(server, rnd, first, tokens, wall, texts, steps=0):
        return {"server": server, "round": rnd, "concurrency": 1, "group": first, "tokens": tokens, "wall_s": wall,
                "texts": texts, "verify_steps": steps}

    runs = [group("plain", 0, 0, 100, 1.0, ["a"]), group("plain", 0, 1, 100, 3.0, ["b"]),
            group("width 16", 0, 0, 100, 0.5, ["a"], steps=10), group("width 16", 0, 1, 100, 0.5, ["x"], steps=10)]
    lines = summary(runs, ["plain", "width 16"], [1], 1, ["header"])
    row = next(line for line in lines if line.startswith("| width 16 |"))
    # plain: 200 tokens in 4 s; width 16: 200 in 1 s; 20 steps; the second group's text differs
    assert row == "| width 16 | 1 | 200.0 | 4.00x | 4.00 | 10.00 | NO |"
    assert "| plain | 1 | 50.0 | 1.00x | 1.00 | - | yes |" in lines
    sampled = summary(runs, ["plain", "width 16"], [1], 1, ["header"], compare_texts=False)
    assert next(line for line in sampled if line.startswith("| width 16 |")).endswith("| - |")


def test_interleaved_ab_turns_are_groups_or_steady_loads_of_whole_groups():
    from benchmarks.interleaved_ab import turns

    assert turns(48, 8) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 48)]   # a group a turn
    assert turns(48, 8, 48) == [(0, 48)]     # one steady load of 48 requests, 8 in flight
    assert turns(40, 16, 32) == [(0, 32), (32, 40)]
    with pytest.raises(ValueError, match="multiple of the concurrency 16"):
        turns(48, 16, 24)


def test_interleaved_ab_keeps_at_most_the_concurrency_in_flight():
    from benchmarks.interleaved_ab import run_group
    from benchmarks.load import Client, Sampling

    from .fake_server import FakeServer

    with FakeServer(delay=0.02, verify_steps=1) as server:
        client = Client(server.url, Sampling(2))
        out = run_group(client, [str(i) for i in range(12)], in_flight=3)
        assert server.peak == 3 and out["tokens"] == 24 and out["verify_steps"] == 12 and len(out["texts"]) == 12
        run_group(client, ["a", "b", "c", "d"])
        assert server.peak == 4    # a group: all at once


def test_cpu_label_names_the_instruction_sets_that_set_the_speed():
    from benchmarks.machine import cpu_label, machine

    assert cpu_label({"cpu": "AMD EPYC", "cpu_family": "23", "simd": ["avx2"]}) == \
        "AMD EPYC (family 23; AVX2, no AVX-512, no AMX)"
    assert cpu_label({"cpu": "Intel(R) Xeon(R) Platinum 8481C", "cpu_family": "6",
                      "simd": ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]}) == \
        "Intel(R) Xeon(R) Platinum 8481C (family 6; AVX2, AVX-512 with bf16, AMX)"
    info = machine()
    assert cpu_label(info).startswith(info.get("cpu") or "unknown CPU")


def test_interleaved_ab_one_thread_servers_differ_only_in_their_openmp_threads():
    from benchmarks.interleaved_ab import SERVERS, server_env

    for name in ("plain", "width 16", "adaptive"):
        assert SERVERS[name + ", 1 thread"] == SERVERS[name]
        assert server_env(name + ", 1 thread")["OMP_NUM_THREADS"] == "1"
        assert server_env(name) is None   # the benchmark's own environment


def test_interleaved_ab_compiled_servers_are_the_same_servers_on_sglangs_flag():
    from benchmarks.interleaved_ab import SERVERS, server_env, server_flags

    for name in ("plain", "width 16", "adaptive"):
        assert SERVERS[name + ", compiled"] == SERVERS[name]
        assert server_env(name + ", compiled") is None   # the flag, not an environment switch
        assert "--enable-torch-compile" in server_flags(name + ", compiled")
        assert "--enable-torch-compile" not in server_flags(name)
