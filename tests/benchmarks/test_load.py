"""benchmarks/load.py against a stand-in server (tests/benchmarks/fake_server.py): what each
kind of server is sent, the records a reply gives, the concurrency a steady load reaches,
the order an open loop sends in, and failures surfaced. Nothing here is a timing threshold."""

import pytest

from benchmarks import load
from benchmarks.load import SGLANG, VLLM, Client, RequestFailed, Sampling
from benchmarks.records import Record, read, write

from .fake_server import FakeServer


def test_both_kinds_of_server_get_the_same_ids_and_greedy_params():
    ids = [1, 350, 201, 2]
    path, ours = Client("http://x", Sampling(32)).request(ids)
    assert path == "/generate"
    assert ours == {"input_ids": ids, "sampling_params": {"max_new_tokens": 32, "temperature": 0.0, "top_k": 1}}
    path, theirs = Client("http://x", Sampling(32), kind=VLLM).request(ids)
    assert path == "/v1/completions"
    assert theirs["prompt"] == ids and theirs["max_tokens"] == 32 and theirs["temperature"] == 0.0
    assert theirs["return_token_ids"] is True and theirs["model"] == load.VLLM_MODEL
    # a text goes as text; sampled requests carry top-k / top-p; ignore_eos where asked
    sampled = Sampling(8, temperature=0.6, top_k=20, top_p=0.95, ignore_eos=True)
    assert Client("http://x", sampled).request("hi")[1] == {
        "text": "hi", "sampling_params": {"max_new_tokens": 8, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                          "ignore_eos": True}}
    assert Client("http://x", sampled, kind=VLLM).request("hi")[1]["top_k"] == 20
    with pytest.raises(ValueError, match="kind"):
        Client("http://x", Sampling(8), kind="tgi")


def test_replies_become_records():
    vllm = Client("http://x", Sampling(2), kind=VLLM)
    assert vllm.parse({"choices": [{"token_ids": [5, 6], "text": "ab"}], "usage": {"completion_tokens": 2}}) == \
        {"output_ids": [5, 6], "text": "ab", "prompt_tokens": 0, "completion_tokens": 2, "verify_steps": 0}
    with pytest.raises(RequestFailed, match="no token_ids"):
        vllm.parse({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}})
    ours = Client("http://x", Sampling(3)).parse(
        {"output_ids": [5, 6, 7], "text": "xyz", "meta_info": {"completion_tokens": 3, "spec_verify_ct": 1}})
    assert ours["output_ids"] == [5, 6, 7] and ours["verify_steps"] == 1 and ours["server_latency_s"] is None


@pytest.mark.parametrize("kind", [SGLANG, VLLM])
def test_send_times_one_request_and_labels_its_record(kind):
    with FakeServer(verify_steps=2) as server:
        rec = Client(server.url, Sampling(4), kind=kind).send([3, 4, 5], method="m", task="t", repeat=1)
    assert (rec.backend, rec.method, rec.task, rec.repeat) == (kind, "m", "t", 1)
    assert rec.completion_tokens == 4 and rec.output_ids == [6, 7, 8, 9] and rec.prompt_tokens == 3
    assert rec.end_s >= rec.start_s and rec.latency_s == pytest.approx(rec.end_s - rec.start_s)
    if kind == SGLANG:   # the server's verify steps, and what they committed
        assert rec.verify_steps == 2 and rec.accepted_tokens == 4 and rec.accept_length == 2.0
    else:                # vLLM reports no steps per request
        assert rec.verify_steps == 0 and rec.accept_length is None


def test_a_steady_load_keeps_the_concurrency_in_flight_and_the_prompt_order():
    prompts = [[i + 1] for i in range(12)]
    with FakeServer(delay=0.05) as server:
        run = load.steady(Client(server.url, Sampling(2)), prompts, 3, method="m", task="t")
        assert server.peak == 3
        peak_all = load.steady(Client(server.url, Sampling(2)), prompts[:4], 4)
        assert server.peak == 4 and peak_all.peak_in_flight == 4    # a group: all at once
    assert [r.prompt_index for r in run.records] == list(range(12))
    assert [r.output_ids[0] for r in run.records] == [i + 2 for i in range(12)]
    assert all(r.concurrency == 3 and 1 <= r.in_flight <= 3 for r in run.records)
    assert run.peak_in_flight == 3 and run.tokens == 24 and run.wall_s > 0
    assert not run.errors and all(r.arrival_rate is None and r.scheduled_s is None for r in run.records)


def test_a_steady_load_of_text_gives_the_replies_text():
    with FakeServer() as server:
        run = load.steady(Client(server.url, Sampling(3)), ["a", "b"], 2)
    assert all(isinstance(r.text, str) and len(r.text) == 3 for r in run.records)
    assert [body["text"] for _, body in sorted(server.bodies, key=lambda b: b[1]["text"])] == ["a", "b"]


def test_open_loop_arrivals_are_seeded_and_in_order():
    even = load.arrival_times(4, rate=10, poisson=False)
    assert even == pytest.approx([0.0, 0.1, 0.2, 0.3])
    poisson = load.arrival_times(50, rate=10, seed=3)
    assert poisson == load.arrival_times(50, rate=10, seed=3) != load.arrival_times(50, rate=10, seed=4)
    assert poisson[0] == 0.0 and all(b > a for a, b in zip(poisson, poisson[1:]))
    with pytest.raises(ValueError, match="rate"):
        load.arrival_times(3, rate=0)


def test_open_loop_sends_on_its_schedule_not_the_servers_pace():
    """Requests held 0.3 s each, arriving every 0.05 s: they overlap (a closed loop of one
    would not), and none is sent before it is due."""
    prompts = [[i + 1] for i in range(6)]
    with FakeServer(delay=0.3) as server:
        run = load.open_loop(Client(server.url, Sampling(1)), prompts, rate=20, poisson=False, task="open")
    assert server.peak > 1 and run.peak_in_flight > 1 and len(server.arrivals) == 6
    assert all(r.concurrency == run.peak_in_flight and r.arrival_rate == 20 and r.task == "open" for r in run.records)
    due = [r.scheduled_s for r in run.records]
    assert [b - a for a, b in zip(due, due[1:])] == pytest.approx([0.05] * 5, abs=1e-5)
    assert all(r.start_s >= r.scheduled_s - 1e-3 for r in run.records)


def test_open_loop_with_a_cap_never_exceeds_it():
    with FakeServer(delay=0.1) as server:
        run = load.open_loop(Client(server.url, Sampling(1)), [[i + 1] for i in range(6)], rate=100,
                             poisson=False, max_in_flight=2)
    assert server.peak <= 2 and run.peak_in_flight <= 2
    assert all(r.start_s >= r.scheduled_s - 1e-3 for r in run.records)


@pytest.mark.parametrize("kind", [SGLANG, VLLM])
def test_failed_requests_are_raised_after_the_batch_or_kept(kind):
    prompts = ["ok", "fail", "ok too"]
    with FakeServer() as server:
        client = Client(server.url, Sampling(2), kind=kind)
        with pytest.raises(RequestFailed, match="1 of 3 requests failed; request 1: .*answered 500"):
            load.steady(client, prompts, 2)
        assert len(server.bodies) == 3            # the others still ran to the end
        run = load.steady(client, prompts, 2, keep_errors=True)
    assert [r.error is not None for r in run.records] == [False, True, False]
    assert run.records[1].completion_tokens == 0 and run.tokens == 4 and run.errors == [run.records[1]]


def test_an_unreachable_server_is_a_failed_request():
    with FakeServer() as server:
        url = server.url
    with pytest.raises(RequestFailed, match="ConnectionError"):
        Client(url, Sampling(1), timeout=5).send([1])


def test_a_flush_refused_while_a_request_leaves_the_batch_is_retried(monkeypatch):
    monkeypatch.setattr(load.time, "sleep", lambda s: None)
    with FakeServer(refuse_flushes=2) as server:
        Client(server.url, Sampling(1)).flush()
        assert server.flushes == ["/flush_cache"] * 3
        server.refuse_flushes = 3
        with pytest.raises(RequestFailed, match="answered 400"):
            Client(server.url, Sampling(1), kind=VLLM).flush(attempts=3)
        assert server.flushes[-3:] == ["/reset_prefix_cache"] * 3


def test_warm_up_sends_every_prompt_at_once_and_short():
    with FakeServer(delay=0.05) as server:
        load.warm_up(Client(server.url, Sampling(64)), [[1], [2], [3]], max_new_tokens=5)
    assert server.peak == 3 and all(b["sampling_params"]["max_new_tokens"] == 5 for _, b in server.bodies)


def test_records_keep_old_lines_readable_and_write_new_fields_only_where_set(tmp_path):
    old = ('{"backend":"sglang","method":"target-only","task":"heldout","concurrency":1,"repeat":0,"prompt_index":0,'
           '"prompt_tokens":28,"completion_tokens":108,"verify_steps":0,"accepted_tokens":0,"accept_lengths":null,'
           '"start_s":21.2,"end_s":21.75,"latency_s":0.55,"tok_per_s":194.6}\n')
    path = tmp_path / "records.jsonl"
    path.write_text(old)
    (rec,) = read(str(path))
    assert rec.in_flight is None and rec.error is None and rec.output_ids is None
    write(str(path), [rec], append=False)
    line = path.read_text()
    assert "in_flight" not in line and "error" not in line and "output_ids" not in line and "equal_output" in line
    served = Record(**{**rec.model_dump(), "in_flight": 3, "output_ids": [1, 2], "text": "ab"})
    write(str(path), [served], append=False)
    line = path.read_text()
    assert '"in_flight":3' in line and "output_ids" not in line and '"text"' not in line
    assert read(str(path))[0].in_flight == 3
