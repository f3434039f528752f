"""`reserve_draft_block(8)`: the decode allocation then covers the 16-slot draft block
after up to 8 tokens of host lag, and a second call adds nothing."""

import inspect
from types import SimpleNamespace


def probe(params) -> dict:
    import sglang.srt.speculative.dflash_info_v2 as info

    from sglang_domino.sglang.step.worker import reserve_draft_block

    def lens(reserve):
        reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=10, kv_allocated_len=12)),
                SimpleNamespace(kv=SimpleNamespace(kv_committed_len=40, kv_allocated_len=80))]
        return info.page_aligned_decode_alloc_lens(reqs, reserve=reserve, page_size=1)

    before = lens(16)
    reserve_draft_block(8)
    reserve_draft_block(8)  # idempotent: one hook, the extra is not added twice
    prepare = inspect.getsource(info.DFlashDraftInputV2.prepare_for_decode)
    return dict(before=before, after=lens(16),
                upstream_call="page_aligned_decode_alloc_lens(" in prepare and "reserve = 2 * block_size" in prepare)
