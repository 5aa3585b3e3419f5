"""Paged KV cache bookkeeping: fixed-size blocks, reference counts, a free list, prefix caching.

A full block is identified by a hash chain: sha256(parent block's hash, this block's token ids,
extra keys) (engine/core/block_hash.py), so equal hashes mean equal whole prefixes, in any
process. Freed blocks keep their hash and stay findable until they are reused; the free list is
in LRU order, so the least recently freed block is evicted first, and a request's tail blocks
are freed before its head (the head is shared more often).
With `kv_events` set to a list, every hash registered, evicted or reset is recorded there as
vLLM's KV cache events (BlockStored / BlockRemoved / AllBlocksCleared) for the engine to publish.
"""
from __future__ import annotations

from collections import OrderedDict

from engine.core.block_hash import external_hash, hash_block
from engine.core.request import Request
from engine.kv_events.events import MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from engine.utils import cdiv

BATCH_INVARIANT_KEYS = ("batch-invariant",)  # the extra keys of a batch-invariant request's blocks


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        # block id -> None; every block with ref count 0, least recently freed first
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found
        self.kv_events: list[KVEvent] | None = None  # a list: record the KV cache events here

    # ---- queries ----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- allocation -------------------------------------------------------------------

    def allocate(self, req: Request, num_new_tokens: int) -> int | None:
        """Make room for up to `num_new_tokens` more tokens of `req`; None if blocks ran out.

        On a request's first allocation (no blocks yet: new or preempted) its cached prefix is
        taken too, which advances `num_computed_tokens` and can shrink the tokens still to
        compute; the return value is how many are scheduled. All or nothing on failure.
        """
        first = not req.block_ids
        # A request that asks for prompt logprobs computes its whole prompt: cached blocks hold no logits
        lookup = self.enable_prefix_caching and req.params.prompt_logprobs is None
        cached = self._find_cached_prefix(req) if first and lookup else []
        num_computed = len(cached) * self.block_size if first else req.num_computed_tokens
        num_new_tokens = min(num_new_tokens, req.num_tokens_with_pending - num_computed)  # drafts get slots too
        need = self.blocks_needed(num_computed + num_new_tokens) - len(req.block_ids) - len(cached)
        revived = sum(1 for b in cached if self.ref_counts[b] == 0)  # cached blocks still in the free list
        if need > self.num_free_blocks - revived:
            return None
        for b in cached:
            self._take(b)
        req.block_ids.extend(cached)
        for _ in range(max(need, 0)):
            b = next(iter(self.free_blocks))
            self._take(b)
            self._forget_hash(b)
            req.block_ids.append(b)
        if first:
            req.num_computed_tokens = num_computed
            # A request resumed after a preemption finds its own blocks: that is neither a prompt
            # lookup nor a cache hit for the statistics, and it keeps its first figure.
            if req.num_preemptions == 0:
                self.prefix_queries += req.num_tokens
                self.prefix_hits += num_computed
                req.num_cached_tokens = num_computed
        return num_new_tokens

    def free(self, req: Request) -> None:
        """Return all of `req`'s blocks; the tail goes to the free list first (evicted first)."""
        for b in reversed(req.block_ids):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                self.free_blocks[b] = None
        req.block_ids = []
        req.num_registered_blocks = 0

    def cache_full_blocks(self, req: Request) -> None:
        """Register the hashes of `req`'s blocks that became full of computed tokens since the
        last call (called every step, so only the new blocks are looked at)."""
        if not self.enable_prefix_caching:
            return
        done = req.num_registered_blocks
        # (with async scheduling the KV of a token not yet read back can be computed: its block waits)
        num_full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        if num_full <= done:
            return
        hashes = self._hashes(req, num_full)
        stored: list[int] = []  # a run of newly registered blocks: one BlockStored event each run
        for i in range(done, num_full):
            b, h = req.block_ids[i], hashes[i]
            if self.block_hash[b] is None and h not in self.hash_to_block:
                self.block_hash[b] = h
                self.hash_to_block[h] = b
                if self.kv_events is not None:
                    stored.append(i)
            elif stored:
                self._record_stored(req, hashes, stored)
                stored = []
        if stored:
            self._record_stored(req, hashes, stored)
        req.num_registered_blocks = num_full

    def _record_stored(self, req: Request, hashes: list[bytes], run: list[int]) -> None:
        assert self.kv_events is not None
        bs, first = self.block_size, run[0]
        extra = extra_keys(req)
        lora = req.params.lora
        self.kv_events.append(BlockStored(
            block_hashes=[external_hash(hashes[i]) for i in run],
            parent_block_hash=external_hash(hashes[first - 1]) if first else None,
            token_ids=req.token_ids[first * bs:(run[-1] + 1) * bs], block_size=bs,
            lora_id=None if lora is None else lora.id, medium=MEDIUM, lora_name=None if lora is None else lora.name,
            extra_keys=None if extra is None else [extra] * len(run)))

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (the scheduler has running requests register again)."""
        events, self.kv_events = self.kv_events, None  # one AllBlocksCleared, not a removal per block
        for b in list(self.hash_to_block.values()):
            self._forget_hash(b)
        if events is not None:
            events.append(AllBlocksCleared())
        self.kv_events = events

    # ---- internals --------------------------------------------------------------------

    def _hashes(self, req: Request, num_full_blocks: int) -> list[bytes]:
        """The request's block-hash chain, extended to at least `num_full_blocks` entries."""
        hashes = req.block_hashes  # they depend on the tokens only, so they outlive a preemption
        tokens, bs = req.token_ids, self.block_size
        extra = extra_keys(req)
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[i * bs:(i + 1) * bs], extra))
        return hashes

    def _find_cached_prefix(self, req: Request) -> list[int]:
        # At least one token must be computed to get logits, so a fully cached sequence
        # recomputes its last block.
        max_blocks = (req.num_tokens - 1) // self.block_size
        found = []
        for h in self._hashes(req, max_blocks)[:max_blocks]:
            b = self.hash_to_block.get(h)
            if b is None:
                break
            found.append(b)
        return found

    def _take(self, b: int) -> None:
        if self.ref_counts[b] == 0:
            del self.free_blocks[b]
        self.ref_counts[b] += 1

    def _forget_hash(self, b: int) -> None:
        h = self.block_hash[b]
        if h is not None:
            self.block_hash[b] = None
            if self.hash_to_block.get(h) == b:
                del self.hash_to_block[h]
                if self.kv_events is not None:
                    self.kv_events.append(BlockRemoved(block_hashes=[external_hash(h)], medium=MEDIUM))


def extra_keys(req: Request) -> tuple | None:
    """What a request's block hashes depend on besides the tokens (vLLM's extra keys). A
    batch-invariant request's K/V differ in their low bits from the fast paths' ones, and a LoRA
    adapter's K/V from the base model's and every other adapter's (keyed by the id of its load: a
    reload is another adapter), so none of them share cached blocks."""
    keys = BATCH_INVARIANT_KEYS if req.params.batch_invariant else ()
    if req.params.lora is not None:
        keys = (*keys, "lora", req.params.lora.id)
    return keys or None
