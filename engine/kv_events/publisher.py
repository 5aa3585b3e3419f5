"""The ZMQ publisher of KV cache events, as vLLM's `ZmqEventPublisher`.

The engine's step loop only puts the step's events on a queue (`publish`: one `put`, no encoding,
no socket); a daemon thread encodes each batch with msgpack and sends it on a PUB socket as three
frames, `[topic, sequence number (8 bytes, big-endian), payload]`, and keeps the last
`buffer_steps` payloads. With a `replay_endpoint`, a ROUTER socket there answers a subscriber that
missed batches: it sends the first sequence number it wants (8 bytes, big-endian) and gets every
buffered batch from there, each as `[seq, payload]`, then `[-1, b""]`. An endpoint with `*` (or
ipc://, inproc://) is bound; any other is connected to, as in vLLM.

A full queue drops the batch (and logs it once in a while) rather than block the engine: a router
that misses events only routes less well, and its replay can fill the gap.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from itertools import count

import msgspec
import zmq

from common.kv_events_config import KVEventsConfig
from engine.kv_events.events import KVEvent, KVEventBatch

logger = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    POLL_S = 0.05  # how often the thread looks at the replay socket when no batch comes

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0):
        self.config = config
        self.data_parallel_rank = data_parallel_rank
        self.queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.topic = config.topic.encode()
        self.dropped = 0
        self.ctx: zmq.Context = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)  # an exiting engine never waits for a slow subscriber
        (self.pub.bind if _binds(config.endpoint) else self.pub.connect)(config.endpoint)
        self.replay: zmq.Socket | None = None
        if config.replay_endpoint:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.bind(config.replay_endpoint)
        self.thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self.thread.start()
        logger.info("KV cache events: publishing on %s%s (topic %r)", config.endpoint,
                    f", replay on {config.replay_endpoint}" if config.replay_endpoint else "", config.topic)

    def publish(self, events: list[KVEvent]) -> None:
        """Called by the step loop: hand the events over, never wait."""
        try:
            self.queue.put_nowait(KVEventBatch(ts=time.time(), events=events,
                                               data_parallel_rank=self.data_parallel_rank))
        except queue.Full:
            self.dropped += 1
            if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, 8, ...: the log stays readable
                logger.warning("KV cache events: the queue is full, %d batches dropped so far", self.dropped)

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (for at most `timeout` seconds), then close the sockets."""
        self.queue.put(None)
        self.thread.join(timeout)
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        seqs = count()
        while True:
            if self.replay is not None and self.replay.poll(0):
                self._serve_replay()
            try:
                batch = self.queue.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            seq = next(seqs)
            payload = encoder.encode(batch)
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            self.buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        assert self.replay is not None
        frames = self.replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV cache events: a replay request of %d frames (3 expected) ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self.buffer):
            if seq >= first:
                self.replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self.replay.send_multipart((client, b"", END_OF_REPLAY, b""))
