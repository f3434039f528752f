"""The profiler's folding of py-spy stacks into buckets, on synthetic samples (no server), and the
committed profile's summary recomputed from its raw samples."""

import gzip

import pytest

from benchmarks import profile_fold as pf
from benchmarks import profile_step as ps

SCHED = 'process 10:"python -m sglang.launch_server";process 11:"sglang::scheduler";thread (11): MainThread'
DETOK = 'process 10:"python -m sglang.launch_server";process 12:"sglang::detokenizer";thread (12): MainThread'
LOOP = "Scheduler.event_loop_overlap (scheduler.py:1000)"
RUN = f"{LOOP};Scheduler.run_batch (scheduler.py:4704)"
TARGET = "TpModelWorker.forward_batch_generation (tp_worker.py:675);ModelRunner.forward (model_runner.py:1860)"
IDLE = f"{SCHED};{LOOP};SchedulerRequestReceiver.recv_requests (scheduler.py:1200);Socket.recv_pyobj (zmq/sugar/socket.py:1033)"
ATTN = (f"{SCHED};{RUN};{TARGET};Qwen3Attention.forward (qwen3.py:343);RadixAttention.forward (radix_attention.py:100);"
        "TorchNativeAttnBackend._run_sdpa_forward_decode (torch_native_backend.py:241)")
LINEAR = f"{SCHED};{RUN};{TARGET};Qwen2MLP.forward (qwen2.py:90);UnquantizedLinearMethod.apply (quantization/unquant.py:614)"
FBG = "DFlashWorkerV2.forward_batch_generation (dflash_worker_v2.py:{})"
ROLLOUT = (f"{SCHED};{RUN};{FBG.format(2710)};around_domino_rollout (sglang_domino/sglang/step/rollout_hook.py:28);"
           "domino_greedy_rollout (domino_utils.py:463);Linear.forward (torch/nn/modules/linear.py:134)")
VERIFY = f"{SCHED};{RUN};{FBG.format(2875)};{TARGET};UnquantizedLinearMethod.apply (quantization/unquant.py:614)"
BOOKKEEPING = f"{SCHED};{LOOP};Scheduler.get_next_batch_to_run (scheduler.py:1500)"


def raw_lines(weights: dict[str, int]) -> list[str]:
    return [f"{stack} {count}" for stack, count in weights.items()]


def test_parse_raw_line_splits_process_thread_frames_and_count():
    process, thread, frames, count = pf.parse_raw_line(ATTN + " 7\n")
    assert process == "sglang::scheduler" and pf.role_of(process) == "scheduler"
    assert pf.is_main_thread(thread)
    assert frames[0] == LOOP.split(";")[0] and "torch_native_backend.py:241" in frames[-1] and count == 7
    assert pf.parse_raw_line("not a sample") is None
    # a recording of the scheduler alone has no process header
    assert pf.parse_raw_line("thread (11): MainThread;a (b.py:1) 2") == ("", "thread (11): MainThread", ["a (b.py:1)"], 2)


def test_fold_gives_phase_and_op_shares():
    parsed = [pf.parse_raw_line(line) for line in raw_lines({IDLE: 20, ATTN: 30, LINEAR: 10, ROLLOUT: 15, VERIFY: 10,
                                                              BOOKKEEPING: 15, DETOK + ";loop (x.py:1)": 99})]
    sched = pf.scheduler_samples(parsed)
    assert sum(n for _, n in sched) == 100   # the detokenizer's samples are not the scheduler's
    phase = pf.fold(sched, pf.PHASE_RULES)
    assert phase["idle, polling for requests"] == pytest.approx(0.20)
    assert phase["decode: target forward"] == pytest.approx(0.40)
    assert phase["rollout (Domino head)"] == pytest.approx(0.15)   # its linear is the rollout's
    assert phase["verify: target forward"] == pytest.approx(0.10)  # not a plain decode forward
    assert phase["scheduling, batch bookkeeping"] == pytest.approx(0.15)
    assert sum(phase.values()) == pytest.approx(1.0)
    op = pf.fold(sched, pf.OP_RULES)
    assert op["attention"] == pytest.approx(0.30)
    assert op["linear / matmul (lm head too)"] == pytest.approx(0.35)   # target's, verify's and rollout's
    assert op["outside the forwards: scheduler, worker, streaming"] == pytest.approx(0.15)


def test_batched_attention_of_the_plugin_is_attention():
    batched = f"{RUN};{TARGET};RadixAttention.forward (radix_attention.py:100);attend (sglang_domino/sglang/cpu/attention.py:71)"
    assert pf.classify(batched.split(";"), pf.OP_RULES) == "attention"


def test_compiled_graphs_are_their_own_bucket_and_attention_inside_them_stays_attention():
    """The opt-in compiled layers: time in the code torch.compile generated is counted as
    such (its frames name no norm or linear), the attention it calls as attention."""
    graph = (f"{RUN};CompiledTarget.__call__ (sglang_domino/sglang/cpu/compiled/forward.py:220);"
             "_TorchDynamoContext.__call__.<locals>.compile_wrapper (torch/_dynamo/eval_frame.py:1261);"
             "CompiledFxGraph.__call__ (torch/_inductor/output_code.py:828);Runner.call (cm4povmv.py:1658)")
    assert pf.classify(graph.split(";"), pf.OP_RULES) == "compiled graphs (torch.compile), their calls"
    inside = graph + ";cpu_attention (sglang_domino/sglang/cpu/compiled/forward.py:95);" \
        "RadixAttention.forward (radix_attention.py:100);attend (sglang_domino/sglang/cpu/attention.py:71)"
    assert pf.classify(inside.split(";"), pf.OP_RULES) == "attention"


def test_fold_of_nothing_is_empty_and_unknown_frames_are_other():
    assert pf.fold([], pf.PHASE_RULES) == {}
    assert pf.fold([(["mystery (a.py:1)"], 3)], pf.PHASE_RULES) == {pf.OTHER: 1.0}


def test_read_raw_reads_gzip_and_top_leaves_filters(tmp_path):
    path = tmp_path / "raw.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(raw_lines({IDLE: 2, ATTN: 3, LINEAR: 5})) + "\n")
    parsed = pf.read_raw(str(path))
    assert [n for *_, n in parsed] == [2, 3, 5]
    sched = pf.scheduler_samples(parsed)
    assert pf.top_leaves(sched)[0] == ("UnquantizedLinearMethod.apply (quantization/unquant.py:614)", 0.5)
    assert pf.top_leaves(sched, within=pf.ATTENTION_FILES) == [
        ("TorchNativeAttnBackend._run_sdpa_forward_decode (torch_native_backend.py:241)", 0.3)]


def test_committed_profile_reproduces_from_its_raw_samples():
    """benchmarks/results/cpu-profile/summary.md is what its runs.json and raw files fold to."""
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = os.path.join(root, "benchmarks", "results", "cpu-profile")
    with open(os.path.join(out, "runs.json"), encoding="utf-8") as fh:
        runs = json.load(fh)
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as fh:
        assert ps.markdown(ps.summarise(out, runs)) == fh.read()


def test_server_flags_follow_the_benchmark_command():
    """`--server-flag` variants (e.g. the compiled step) reach `sglang serve`'s command line,
    after the draft's arguments (the benchmark's SERVER_ARGS, e.g. the dtype, last)."""
    from benchmarks.common import bench_config

    cfg = bench_config(2, [1])
    plain = ps.server_command(cfg, 30000, "plain")
    compiled = ps.server_command(cfg, 30000, "domino", ["--enable-torch-compile"])
    assert "--enable-torch-compile" not in plain
    without = ps.server_command(cfg, 30000, "domino")
    at = compiled.index("--enable-torch-compile")
    assert at > compiled.index("--speculative-draft-model-path")
    assert compiled[:at] + compiled[at + 1:] == without
