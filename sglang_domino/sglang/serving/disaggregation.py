"""Prefill-decode disaggregation with DFLASH drafts: both sides must draft alike.

With a DFLASH draft, the prompt's draft context (the draft's KV for the prompt, computed
from the target's hidden states while the prompt is prefilled) is made on the prefill
server and travels to the decode server with the target's KV (0.5.23 appends the draft
pool's buffers to the transfer: `disaggregation/prefill.py`, `PrefillBootstrapQueue`).
0.5.23 exchanges no speculative settings between the two sides, so:

  * a decode server that drafts while its prefill server does not (the launch of sglang
    #36140) never receives that context: outputs stay exact, but every step drafts from
    an empty context and acceptance silently drops;
  * a prefill server with another draft sends a context the decode draft cannot use;
  * a prefill server that drafts, paired with a decode server that does not, sends the
    draft's buffers to a server that has none: its transfer thread dies
    (`mooncake/conn.py` `_send_kvcache_generic`, IndexError) and the prefill server with it.

A decode server meets its prefill servers only per request (the gateway pairs them), so
the check cannot run at start-up: the first time a decode server resolves a prefill
server (`DecodePreallocQueue._init_receiver`) it reads that server's
`/server_info`. The first two cases are served, with a warning naming the fix, once per
prefill server; the third is refused: the requests fail with the same message before any
KV index is sent, and the prefill server drops them.

The rows are installed at scheduler start in servers with a disaggregation mode (the
`disaggregation` group of `hooks.py`; `cpu disaggregation` too on CPU).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10


def draft_of(settings: dict) -> str | None:
    """The draft that makes the prompt's draft context: its checkpoint's name for a
    DFLASH server (a directory's or repository's last component, so that the same
    checkpoint at two paths compares equal), None for any other server."""
    if str(settings.get("speculative_algorithm") or "").upper() != "DFLASH":
        return None
    path = str(settings.get("speculative_draft_model_path") or "").rstrip("/")
    return os.path.basename(path) or path


def mismatch(local: dict, remote: dict, prefill_url: str) -> str | None:
    """The warning for a decode server (`local` settings) paired with a prefill server
    (`remote`, its `/server_info`), or None when they draft alike."""
    mine, theirs = draft_of(local), draft_of(remote)
    if mine == theirs:
        return None
    flags = (f"--speculative-algorithm DFLASH --speculative-draft-model-path "
             f"{local.get('speculative_draft_model_path')}")
    if theirs is None:
        return (f"PD draft mismatch: this decode server drafts with DFLASH ({mine}) but the prefill server "
                f"{prefill_url} serves without a DFLASH draft (speculative_algorithm="
                f"{remote.get('speculative_algorithm')}), so the prompt's draft context never arrives: outputs "
                f"stay exact, acceptance drops. Fix: start the prefill server with {flags}.")
    if mine is None:
        return (f"PD draft mismatch, refused: the prefill server {prefill_url} sends a DFLASH draft context "
                f"({theirs}) that this decode server, without a DFLASH draft, has no room for (SGLang 0.5.23's "
                f"transfer would fail and take the prefill server down). Fix: start this decode server with "
                f"--speculative-algorithm DFLASH --speculative-draft-model-path "
                f"{remote.get('speculative_draft_model_path')}, or drop the draft from the prefill server.")
    return (f"PD draft mismatch: this decode server drafts with {mine} but the prefill server {prefill_url} "
            f"computes the prompt's draft context with {theirs}: acceptance drops. Fix: start both servers with "
            f"the same --speculative-draft-model-path.")


def around_init_receiver(original, self, decode_req, *args, **kwargs):
    """Decode side, as each request's receiver is set up: its prefill server is checked
    once (on every rank alike, so that the ranks agree). A request bound for a refused
    one fails with the refusal; its receiver has bootstrapped but has sent no KV
    indices, so the prefill server learns of the abort and never transfers."""
    result = original(self, decode_req, *args, **kwargs)
    from sglang.srt.disaggregation.decode import _bootstrap_addr

    refusal = check_once(self.kv_manager, _bootstrap_addr(decode_req.req))
    receiver = decode_req.kv_receiver
    if refusal is not None and receiver is not None:
        receiver.abort()
        # after abort(), which records its own reason: the client reads this one
        self.kv_manager.record_failure(decode_req.req.bootstrap_room, refusal)
    return result


_verdicts: dict[str, str | None] = {}


def check_once(kv_manager, bootstrap_addr: str) -> str | None:
    """The refusal for a prefill server (None: serve), decided on first contact; warnings
    are logged by the first rank only."""
    if bootstrap_addr in _verdicts:
        return _verdicts[bootstrap_addr]
    first_rank = getattr(kv_manager.kv_args, "engine_rank", 0) == 0
    info = kv_manager.prefill_info_table.get(bootstrap_addr)
    port = getattr(info, "prefill_http_port", None)
    if port is None:
        if first_rank:
            logger.warning("PD draft check skipped: the prefill server at bootstrap address %s did not register "
                           "its HTTP port", bootstrap_addr)
        _verdicts[bootstrap_addr] = None
        return None
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.utils.network import NetworkAddress

    spec = get_spec()
    algorithm = spec.speculative_algorithm
    local = {"speculative_algorithm": getattr(algorithm, "name", algorithm) or None,
             "speculative_draft_model_path": spec.speculative_draft_model_path}
    url = NetworkAddress(NetworkAddress.parse(bootstrap_addr).host, int(port)).to_url()
    _verdicts[bootstrap_addr] = verdict = check_prefill_server(url, local, log=first_rank)
    return verdict


def check_prefill_server(url: str, local: dict, log: bool = True) -> str | None:
    """Read the prefill server's settings; log the mismatch, if any; return it when the
    pair cannot serve (the prefill server drafts and this one does not)."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=CHECK_TIMEOUT_S) as response:
            remote = json.load(response)
    except (OSError, ValueError) as exc:
        if log:
            logger.warning("PD draft check: could not read %s/server_info (%s); make sure the prefill server "
                           "drafts with the same DFLASH draft as this decode server", url, exc)
        return None
    message = mismatch(local, remote, url)
    fatal = message is not None and draft_of(local) is None
    if log and message:
        logger.error(message) if fatal else logger.warning(message)
    elif log:
        logger.info("PD draft check: the prefill server %s drafts as this decode server does (%s)",
                    url, draft_of(local) or "no DFLASH draft")
    return message if fatal else None
