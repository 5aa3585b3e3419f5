"""The responses kept for previous_response_id and GET /v1/responses/{id}: bounded, in memory.

Each entry holds the response as it was answered and the conversation that led to it (every
earlier turn, this turn's input and its output, as chat messages; not the instructions, which
OpenAI does not carry over to the next response). At most `capacity` entries; the oldest is
dropped first, so memory stays bounded however long the server runs. A restart forgets them all.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from common.messages import ChatMessage


@dataclass
class StoredResponse:
    response: dict
    conversation: list[ChatMessage]


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def __len__(self) -> int:
        return len(self._entries)
