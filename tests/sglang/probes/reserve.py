"""`reserve_draft_block(8)` with the `b8 reservation` group installed as the worker installs
it (its predicate of a worker with draft block 16 and window 8): the decode allocation then
covers the 16-slot draft block after up to 8 tokens of host lag, and a second call adds
nothing."""

import inspect
from types import SimpleNamespace


def probe(params) -> dict:
    import sglang.srt.speculative.dflash_info_v2 as info

    from sglang_domino.sglang.seam import hooks
    from sglang_domino.sglang.step.worker import reserve_draft_block

    def lens(reserve):
        reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=10, kv_allocated_len=12)),
                SimpleNamespace(kv=SimpleNamespace(kv_committed_len=40, kv_allocated_len=80))]
        return info.page_aligned_decode_alloc_lens(reqs, reserve=reserve, page_size=1)

    before = lens(16)
    b8_worker = SimpleNamespace(draft_block=16, block_size=8)
    reserve_draft_block(8)
    assert hooks.install_group(hooks.B8_RESERVATION, b8_worker)
    reserve_draft_block(8)  # idempotent: one hook, the extra is not added twice
    assert hooks.install_group(hooks.B8_RESERVATION, b8_worker)
    assert not hooks.install_group(hooks.B8_RESERVATION, SimpleNamespace(draft_block=16, block_size=16))
    prepare = inspect.getsource(info.DFlashDraftInputV2.prepare_for_decode)
    return dict(before=before, after=lens(16),
                upstream_call="page_aligned_decode_alloc_lens(" in prepare and "reserve = 2 * block_size" in prepare)
