"""End to end on CPU: `sglang serve --device cpu --speculative-algorithm DFLASH` with
DFlash and Domino drafts, verify width = block (16), 8 and adaptive, against the same
server without speculation and against the Transformers backend."""

from __future__ import annotations

import re

import pytest
import torch

from tests.e2e.client import (CHAT, HF_PROMPTS, MAX_TOKENS, PENALISED, PROMPTS, chat, check_compiled_before_serving,
                              check_streams_and_abort, completion, generate_ids, generate_penalised, onednn_kernels,
                              transformers_spec)
from tests.helpers import tiny
from tests.helpers.servers import ADAPTIVE_LOG_EVERY, BLOCK, SPEC_CONFIGS, server_env

pytestmark = pytest.mark.sglang_e2e


@pytest.fixture(scope="module", params=list(SPEC_CONFIGS))
def spec(request, models, start, expected):
    """One speculative server per configuration (`server.config`: its ServerConfig);
    pytest groups the tests by it."""
    config = SPEC_CONFIGS[request.param]
    server = start(config.args(models), config.name, env=server_env(start.tmp, **config.env))
    server.config = config
    yield server
    server.stop()


def test_completions_and_chat_match_plain_server(spec, expected):
    for prompt in PROMPTS:
        got = completion(spec, prompt)
        assert got == expected["completions"][prompt], (spec.config.name, prompt)
        assert got[1] == MAX_TOKENS
    assert chat(spec, CHAT) == expected["chat"]


@pytest.mark.parametrize("name", list(PENALISED))
def test_penalised_greedy_output_matches_plain_server(spec, expected, name):
    """Each penalty changes the plain server's answer here, and each speculative server
    gives that answer: every position of a verified block is penalised with the tokens
    before it (`penalty_state`)."""
    want = expected["penalised"][name]
    assert want != expected["unpenalised"], f"{name} has no effect on this prompt"
    assert generate_penalised(spec, PENALISED[name]) == want, (spec.config.name, name)


def test_sampled_min_new_tokens_holds_the_stop_token_back(spec):
    """temperature 1 with min_new_tokens 12 and the target's top token as a stop id: no
    answer stops before 12 tokens (the stop token has probability 0 at every verified
    position before it, so the exact accept never commits it there), while without
    min_new_tokens some answers do."""
    stop = {"temperature": 1.0, "max_new_tokens": 24, "stop_token_ids": [300]}
    rows = [HF_PROMPTS[2]] * 32

    def lengths(params):
        status, body = spec.post("/generate", {"input_ids": rows, "sampling_params": params})
        assert status == 200, body
        return [len(row["output_ids"]) for row in body]

    # power: about a fifth of the rows stop before 12 without min_new_tokens; 32 rows all
    # running past it is a ~1e-3 event (seen once in CI), so up to three draws are taken
    assert any(min(lengths(stop)) < 12 for _ in range(3)), "the stop token never came early: the test has no power"
    assert min(lengths({**stop, "min_new_tokens": 12})) >= 12, spec.config.name


def test_generate_reports_speculation(spec):
    config = spec.config
    body = generate_ids(spec, [5, 77, 300, 41, 9])
    meta = body["meta_info"]
    assert meta["spec_verify_ct"] > 0
    assert meta["completion_tokens"] == MAX_TOKENS
    width = config.verify_window
    # every verify step commits between 1 and `width` tokens (prefill gives the first)
    assert meta["spec_verify_ct"] * 1 <= MAX_TOKENS - 1 <= meta["spec_verify_ct"] * width
    # proposals the target verified per step: 15 of the 16-slot block, 7 with width 8 (the
    # draft block is still 16), 16 with the HF window; adaptive: W - 1 per step at width W
    # (`request_accept.py`), and the rate is over those
    if config.adaptive:
        assert meta["spec_num_correct_drafts"] <= meta["spec_num_proposed_drafts"] \
            <= meta["spec_verify_ct"] * config.proposals_per_step
        if meta["spec_num_proposed_drafts"]:
            assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"]
                                                             / meta["spec_num_proposed_drafts"])
        else:   # every step at width 1 (the policy times width 1 early): nothing proposed, no rate
            assert "spec_accept_rate" not in meta
    else:
        assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * config.proposals_per_step
    # the scheduler process ran this project's worker (the plugin, loaded through its entry point)
    log = spec.log()
    shown = "adaptive [16, 8, 4, 2, 1]" if config.adaptive else width
    assert f"sglang-domino DFLASH worker: device=cpu, draft block={BLOCK}, verify width={shown}" in log
    # the scheduler and detokenizer were forked from the launcher (`cpu/start_method.py`)
    assert "sglang-domino: the CPU scheduler processes forked" in log
    assert "sglang-domino: the CPU detokenizer processes forked" in log
    # the worker's install groups, chosen by the manifest's predicates of the worker
    groups = set(re.search(r"sglang-domino worker groups: ([^\n]*)", log).group(1).split(", "))
    assert {"checkpoint compat", "cpu dflash", "penalties"} <= groups
    assert ("b8 reservation" in groups) == (width < BLOCK and not config.adaptive), groups
    assert ("adaptive metrics" in groups) == config.adaptive, groups
    assert ("domino rollout" in groups) == config.draft.startswith("domino"), groups
    # and the target computed `width` positions per request, not the draft block's 16
    tokens, requests = map(int, re.search(r"first verify: the target computed (\d+) tokens for (\d+) request", log).groups())
    assert tokens == width * requests


def test_accept_lengths_match_transformers_backend(spec, models):
    """Same tokens and the same number of verify steps as the Transformers backend run
    with the server's window (15 proposals for block 16, width - 1, or the backend's
    default 16 proposals / 17 verified for domino_hf17)."""
    config = spec.config
    width = config.verify_window
    total_steps = 0
    for ids in HF_PROMPTS:
        hf_tokens, stats = transformers_spec(models, config.draft, ids, width)
        body = generate_ids(spec, ids)
        assert body["output_ids"] == hf_tokens, (config.name, ids)
        meta = body["meta_info"]
        if config.adaptive:  # steps at other widths commit other counts; the tokens are the same
            continue
        assert meta["spec_verify_ct"] == stats.num_verify_steps, (config.name, ids, stats.accept_lengths)
        assert max(stats.accept_lengths) <= width
        total_steps += stats.num_verify_steps
    # the fixture is built so drafts are right about half the time: steps commit > 1 token
    assert config.adaptive or total_steps < len(HF_PROMPTS) * (MAX_TOKENS - 1)


SAMPLED_PROMPT = [5, 77, 300, 41, 9]
SAMPLED_ROWS = 240
# The test target's lm_head has two live rows (+w, -w, `tiny.LIVE_TOKENS`) and zero
# elsewhere: at this temperature the larger live token takes a context-dependent share
# (from a few percent to nearly all), the 510 zero-logit tokens share the rest. Exact
# and tie-free (no top-k/top-p over the tied zeros).
SAMPLED_TEMPERATURE = 0.15


def _exact_next(target, ids, output=(), frequency_penalty=0.0):
    """The target's own next-token distribution at SAMPLED_TEMPERATURE after `ids`, whose
    tail `output` the request generated: plain decoding subtracts `frequency_penalty`
    per earlier occurrence of each output token before the temperature."""
    from sglang_domino.sampling import SamplingParams, to_probs

    with torch.no_grad():
        logits = target(torch.tensor([ids])).logits[0, -1]
    for token in output:
        logits[token] -= frequency_penalty
    return to_probs(logits, SamplingParams(temperature=SAMPLED_TEMPERATURE))


# 0.6 / 0.15 = 4 nats off a live token's log-odds per earlier occurrence; after this prompt
# the target repeats its top token (p 0.95 at token 2 unpenalised, 0.24 penalised)
SAMPLED_PENALISED = ([7] * 6, 0.6)


@pytest.mark.parametrize("prompt, frequency_penalty", [(SAMPLED_PROMPT, 0.0), SAMPLED_PENALISED], ids=["plain", "penalised"])
def test_sampled_output_follows_the_target_distribution(spec, models, prompt, frequency_penalty):
    """temperature > 0 on CPU: tokens 2 and 3 of each answer come out of speculative
    verification (token 1 out of the prefill) and must follow the target's distribution
    given what precedes them (0.5.23 alone verifies them by greedy argmax on CPU).
    Pooled per position over the rows: how often the token is the target's argmax (a
    live token, the draft's usual proposal) and how often one of the zero-logit tokens,
    against the exact conditional probabilities of each row's own prefix. With a
    frequency penalty, each of those follows the penalty of the tokens before it, the
    ones earlier in the same verified block included (0.5.23 penalises none of them)."""
    params = {"max_new_tokens": 3, "ignore_eos": True, "temperature": SAMPLED_TEMPERATURE,
              "frequency_penalty": frequency_penalty}
    status, body = spec.post("/generate", {"input_ids": [prompt] * SAMPLED_ROWS, "sampling_params": params})
    assert status == 200, body
    outs = [row["output_ids"] for row in body]
    assert all(len(o) == 3 for o in outs)
    verify_steps = sum(row["meta_info"]["spec_verify_ct"] for row in body)
    if spec.config.adaptive:
        # the policy may verify this batch at width 1 (plain decoding: nothing to accept)
        # where that is the cheapest per token on this machine at this batch size
        assert 0 < verify_steps <= 2 * SAMPLED_ROWS
    else:
        assert 0 < verify_steps < 2 * SAMPLED_ROWS  # some steps accepted a draft token
    cache = {}
    for position in (1, 2):
        observed = torch.zeros(2, dtype=torch.float64)
        expected = torch.zeros(2, dtype=torch.float64)
        variance = torch.zeros(2, dtype=torch.float64)
        unpenalised = torch.zeros(2, dtype=torch.float64)
        for o in outs:
            prefix = tuple(o[:position])
            if prefix not in cache:
                ids = prompt + list(prefix)
                cache[prefix] = (_exact_next(models["hf_target"], ids, prefix, frequency_penalty).double(),
                                 _exact_next(models["hf_target"], ids).double())
            p, p0 = cache[prefix]
            top = int(p0.argmax())
            assert top in tiny.LIVE_TOKENS
            bins = torch.stack([p[top], 1 - p[list(tiny.LIVE_TOKENS)].sum()])
            unpenalised += torch.stack([p0[top], 1 - p0[list(tiny.LIVE_TOKENS)].sum()])
            observed += torch.tensor([o[position] == top, o[position] not in tiny.LIVE_TOKENS], dtype=torch.float64)
            expected += bins
            variance += bins * (1 - bins)
        z = (observed - expected) / variance.sqrt()
        assert bool((z.abs() < 4.5).all()), (spec.config.name, position, observed.tolist(), expected.tolist())
        # the check has power: a greedy verify would emit the argmax on every row
        assert SAMPLED_ROWS - expected[0] > 10 * variance[0].sqrt()
        if frequency_penalty:   # and the penalty of the earlier tokens moves what is expected
            assert (expected - unpenalised).abs().max() > 10 * variance.sqrt().max(), (position, expected, unpenalised)


def test_mixed_batch_keeps_greedy_rows_exact(spec, expected):
    """One batch of greedy and sampled requests (a sampled row makes the whole batch take
    the sampled verify path): the greedy rows are the plain server's, token for token."""
    greedy = {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    sampled = {"max_new_tokens": MAX_TOKENS, "temperature": 1.0, "ignore_eos": True}
    input_ids = [ids for ids in HF_PROMPTS for _ in range(2)]
    params = [greedy, sampled] * len(HF_PROMPTS)
    status, body = spec.post("/generate", {"input_ids": input_ids, "sampling_params": params})
    assert status == 200, body
    assert [row["output_ids"] for row in body[::2]] == expected["generate"], spec.config.name
    assert all(len(row["output_ids"]) == MAX_TOKENS for row in body[1::2])


def test_concurrent_streams_complete_and_free_their_kv(spec, expected):
    """8 streams of different lengths plus one aborted mid-stream: the 8 give the plain
    server's text, the aborted one ends early with an abort, and every KV slot comes back."""
    check_streams_and_abort(spec, expected["streams"])


def test_malformed_requests_do_not_kill_the_server(spec):
    bad = [
        b"{not json",
        {"model": "default", "prompt": "hi", "max_tokens": -3},
        {"model": "default", "prompt": [10 ** 9], "max_tokens": 4},
        {"model": "default", "max_tokens": 4},
    ]
    for payload in bad:
        status, body = spec.post("/v1/completions", payload)
        assert 400 <= status < 500, (payload, status, body)
    status, body = spec.post("/generate", {"input_ids": [tiny.TARGET_VOCAB + 5], "sampling_params": {"max_new_tokens": 4}})
    assert 400 <= status < 500, body
    assert spec.proc.poll() is None
    text, n = completion(spec, PROMPTS[0])
    assert n == MAX_TOKENS


def test_adaptive_server_logs_its_widths(spec):
    """An adaptive server reports the widths it chose: each width's first use and, every
    ADAPTIVE_LOG_EVERY decode steps, the histogram; by now (the module's other tests ran
    on it, 8 concurrent streams among them) it has verified at more than one width."""
    if not spec.config.adaptive:
        pytest.skip("fixed verify width")
    log = spec.log()
    first = {int(w) for w in re.findall(r"adaptive verify: width (\d+) first chosen", log)}
    assert len(first) >= 2 and first <= {16, 8, 4, 2, 1}, first
    hists = re.findall(r"adaptive verify: (\d+) decode steps by verify width \{([^}]*)\}", log)
    assert hists, log[-3000:]
    steps, hist = hists[-1]
    counts = {int(k): int(v) for k, v in (item.split(":") for item in hist.split(", "))}
    assert sum(counts.values()) == int(steps) and int(steps) % ADAPTIVE_LOG_EVERY == 0
    assert {w for w, n in counts.items() if n} == first


def test_compiled_forwards_and_rollout_compile_before_serving(spec):
    """With the layers and the rollout compiled, the target's, the draft's and the
    rollout's graphs are all compiled while the server starts: none is compiled while it
    serves (by now it has served one to eight streams at every adaptive width, prefills
    of several lengths; dynamo logs any recompile once the forwards are warm); and oneDNN,
    logging the kernels it builds, built none twice (none evicted from its cache)."""
    if "--enable-torch-compile" not in spec.config.flags:
        pytest.skip("eager forwards")
    log = spec.log()
    check_compiled_before_serving(log)
    if spec.config.env.get("ONEDNN_VERBOSE"):   # the check above read oneDNN's log: there is one
        assert onednn_kernels(log), log[-3000:]


def test_compiled_server_refuses_online_weight_updates(spec, models, expected):
    """The compiled step multiplies through copies of the weights packed for oneDNN at
    load: an online weight update is refused with the reason before any weight is written
    (upstream's `_derived_weight_cache_error` check), and the server serves on unchanged."""
    if "--enable-torch-compile" not in spec.config.flags:
        pytest.skip("eager forwards")
    status, body = spec.post("/update_weights_from_disk", {"model_path": models["target"]})
    assert status == 400 and not body["success"], body
    assert "--enable-torch-compile" in body["message"] and "packed" in body["message"], body
    assert completion(spec, PROMPTS[0]) == expected["completions"][PROMPTS[0]]
