"""Input-grounded chat requests: repeat, quote or edit a given text of about 300 tokens.

The answers copy long runs of their input, the case n-gram speculative decoding is for; used by
`python -m benchmarks --speculative` and by the tests that check speculation leaves greedy
output unchanged.
"""
from __future__ import annotations

TEXT = (
    "The lighthouse at the end of the harbour was built in 1871 from granite quarried on the island. "
    "For more than a century a keeper climbed its one hundred and twelve steps every evening to light "
    "the lamp, and every morning to clean the lens and trim the wick. The light could be seen from "
    "twenty miles out at sea, and fishermen used it to find the narrow channel between the rocks. "
    "In 1962 the lamp was replaced by an electric light, and in 1989 the last keeper left the island, "
    "when the light was made automatic. Today the tower is a small museum. Visitors can climb the "
    "stairs, see the old brass lens, and read the logbooks in which the keepers wrote down the weather, "
    "the ships that passed, and the storms that kept them awake at night. The museum is open from April "
    "to October, every day except Monday, from ten in the morning until five in the afternoon. Tickets "
    "cost six pounds for adults and three pounds for children, and the ferry from the harbour leaves "
    "every hour on the hour."
)

INSTRUCTIONS = [
    "Repeat the following text exactly, word for word.",
    "Copy the following text, but write 'tower' instead of 'lighthouse'.",
    "Quote the first three sentences of the following text.",
    "Rewrite the following text with every number written in digits.",
    "Copy the following text and put each sentence on its own line.",
    "Repeat the following text, then add one sentence about the ferry.",
    "Correct any mistakes in the following text and return the whole text.",
    "Summarise the following text, quoting its key sentences.",
]


def grounded_messages() -> list[list[dict[str, str]]]:
    """Eight single-turn chat conversations about TEXT."""
    return [[{"role": "user", "content": f"{instruction}\n\n{TEXT}"}] for instruction in INSTRUCTIONS]
