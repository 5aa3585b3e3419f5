"""KV cache events: block hashes equal in every process, the events the block manager records, and
the ZMQ publisher's frames and replay as vLLM's subscribers (and vllm-router) read them."""
from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import time

import msgspec
import pytest
import zmq

from common.kv_events_config import KVEventsConfig, parse_kv_events_config
from common.messages import SamplingParams
from engine.core.block_hash import ROOT_HASH, external_hash, hash_block
from engine.core.block_manager import BlockManager
from engine.core.request import Request
from engine.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored
from engine.kv_events.publisher import ZmqEventPublisher

HASH_IN_CHILD = ("from engine.core.block_hash import hash_block; "
                 "print(hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8]).hex())")


def test_block_hash_is_the_same_in_every_process():
    here = hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8]).hex()
    for seed in ("1", "2", "random"):  # Python's hash() would differ between these
        out = subprocess.run([sys.executable, "-c", HASH_IN_CHILD], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, cwd=os.getcwd())
        assert out.stdout.strip() == here


def test_block_hash_is_vllms_sha256_of_the_pickled_tuple():
    expected = hashlib.sha256(pickle.dumps((ROOT_HASH, (1, 2, 3, 4), None), protocol=5)).digest()
    assert hash_block(None, [1, 2, 3, 4]) == expected
    assert ROOT_HASH == hashlib.sha256(pickle.dumps("0", protocol=5)).digest()  # vLLM's with PYTHONHASHSEED=0
    assert hash_block(None, [1, 2, 3, 4], ("batch-invariant",)) != expected
    assert external_hash(expected) == int.from_bytes(expected[-8:], "big")


def _run(bm: BlockManager, rid: str, tokens: list[int], params: SamplingParams | None = None) -> Request:
    req = Request(rid, tokens, params or SamplingParams(), 4)
    assert bm.allocate(req, len(tokens)) is not None
    req.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(req)
    return req


def test_block_manager_records_stored_removed_and_cleared():
    bm = BlockManager(num_blocks=5, block_size=2, enable_prefix_caching=True)
    bm.kv_events = []
    a = _run(bm, "a", [1, 2, 3, 4, 5])
    h1 = hash_block(None, [1, 2])
    h2 = hash_block(h1, [3, 4])
    assert bm.kv_events == [BlockStored(block_hashes=[external_hash(h1), external_hash(h2)], parent_block_hash=None,
                                        token_ids=[1, 2, 3, 4], block_size=2, lora_id=None, medium="GPU",
                                        lora_name=None)]
    bm.kv_events.clear()
    b = _run(bm, "b", [1, 2, 3, 4, 9, 9, 8])  # shares both blocks, stores one more after them
    h3 = hash_block(h2, [9, 9])
    assert bm.kv_events == [BlockStored(block_hashes=[external_hash(h3)], parent_block_hash=external_hash(h2),
                                        token_ids=[9, 9], block_size=2, lora_id=None, medium="GPU", lora_name=None)]
    bm.kv_events.clear()
    bm.free(a)
    bm.free(b)
    _run(bm, "c", [7] * 9)  # all 5 blocks: the cached ones are evicted, tail first
    removed = [e for e in bm.kv_events if isinstance(e, BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(map(external_hash, (h1, h2, h3)))
    bm.kv_events.clear()
    bm.reset_prefix_cache()
    assert bm.kv_events == [AllBlocksCleared()]


def test_batch_invariant_blocks_carry_their_extra_keys():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    bm.kv_events = []
    _run(bm, "a", [1, 2, 3], SamplingParams(batch_invariant=True))
    (stored,) = bm.kv_events
    assert stored.extra_keys == [("batch-invariant",)]
    assert stored.block_hashes == [external_hash(hash_block(None, [1, 2], ("batch-invariant",)))]


def test_no_events_are_recorded_unless_asked():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    _run(bm, "a", [1, 2, 3])
    assert bm.kv_events is None


def test_config_parses_vllms_json_and_names_bad_keys():
    config = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "zmq", '
                                    '"endpoint": "tcp://*:5557", "topic": "kv"}')
    assert config == KVEventsConfig(enable_kv_cache_events=True, topic="kv") and config.publishes
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").publishes
    for bad, word in (('{"enable_kv_cache_events": true, "port": 1}', "port"), ('{"publisher": "kafka"}', "kafka"),
                      ('{"buffer_steps": 0}', "buffer_steps"), ("[1]", "object")):
        with pytest.raises(Exception, match=word):
            parse_kv_events_config(bad)


# As vLLM's subscriber example decodes them (vllm-router reads the same bytes).
class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[dict]
    data_parallel_rank: int | None = None


def test_publisher_frames_and_replay(tmp_path):
    endpoint, replay = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    publisher = ZmqEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint,
                                                 replay_endpoint=replay, topic="kv"))
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    time.sleep(0.3)  # a PUB drops what it sends before the subscription arrives
    stored = BlockStored(block_hashes=[7], parent_block_hash=None, token_ids=[1, 2], block_size=2, lora_id=None,
                         medium="GPU", lora_name=None)
    before = time.time()
    publisher.publish([stored])
    publisher.publish([BlockRemoved(block_hashes=[7], medium="GPU"), AllBlocksCleared()])
    assert sub.poll(5000)
    topic, seq, payload = sub.recv_multipart()
    assert topic == b"kv" and int.from_bytes(seq, "big") == 0
    batch = msgspec.msgpack.decode(payload, type=_Batch)
    assert before <= batch.ts <= time.time() and batch.data_parallel_rank == 0
    assert batch.events == [{"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
                             "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU",
                             "lora_name": None}]
    assert sub.poll(5000)
    _, seq, payload = sub.recv_multipart()
    assert int.from_bytes(seq, "big") == 1
    assert [e["type"] for e in msgspec.msgpack.decode(payload, type=_Batch).events] == ["BlockRemoved",
                                                                                          "AllBlocksCleared"]
    client = ctx.socket(zmq.REQ)  # a subscriber that missed batches from 1 on
    client.connect(replay)
    client.send((1).to_bytes(8, "big"))
    assert client.poll(5000)
    replayed = [client.recv_multipart()]  # REQ takes one reply; the ROUTER's later frames go to a DEALER
    assert int.from_bytes(replayed[0][0], "big") == 1 and replayed[0][1] == payload
    publisher.shutdown()
    sub.close(linger=0)
    client.close(linger=0)
