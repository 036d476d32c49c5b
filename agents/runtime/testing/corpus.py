"""A small built-in English corpus for training test tokenizers, plus deterministic pseudo-words so a large
vocabulary has enough distinct pairs to merge. Written for this project; no external text."""

from __future__ import annotations

import random

PARAGRAPHS: tuple[str, ...] = (
    "The harbour woke before the sun. Fishing boats slid past the breakwater, their lamps swinging, while gulls "
    "argued over the nets drying on the quay. By seven the market had opened and the smell of bread drifted "
    "down from the bakery on the hill.",
    "A model is only as useful as the hardware it runs on. On the day new weights are released, engineers "
    "want to know three things: does it load, does it compute the right numbers, and how fast does it answer?",
    "Water boils at one hundred degrees Celsius at sea level, but at the top of a tall mountain it boils at a "
    "lower temperature, because the air pressure is lower. Cooking pasta there takes noticeably longer.",
    "She opened the old notebook and found a list of numbers: 3, 14, 15, 92, 65, 35. Her grandfather had "
    "written them in pencil, and beside them, in a careful hand, the words 'remember the circle'.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n",
    "Question: What is the capital of France?\nAnswer: Paris.\nQuestion: How many legs does a spider have?\n"
    "Answer: Eight.\nQuestion: Which planet is closest to the sun?\nAnswer: Mercury.",
    "The committee met on Tuesday to discuss the budget. After a long debate they agreed to repair the bridge "
    "first, then the library roof, and to postpone the new playground until the spring.",
    "Rivers carry sand and silt from the mountains to the sea. Over thousands of years the sediment builds "
    "deltas, wide flat plains where the river splits into many small channels before it meets the tide.",
    "User: Can you help me plan a trip?\nAssistant: Of course. Where would you like to go, and for how long?\n"
    "User: Somewhere warm, for a week.\nAssistant: Then consider the coast in the south; the weather is mild.",
    "Every morning the baker weighed the flour, the salt, the water and the yeast. She mixed them slowly, let "
    "the dough rest, folded it, and rested it again. Patience, she said, is the most important ingredient.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick "
    "daft zebras jump! Sphinx of black quartz, judge my vow.",
    "In the winter the lake froze so thick that children skated from one shore to the other. Their parents "
    "stood by small fires, drinking tea and telling stories about the years when the ice had not come at all.",
    "Numbers and symbols: 2 + 2 = 4, 10 / 5 = 2, 7 * 6 = 42, 100 - 1 = 99; (x, y) -> [x + y]; {key: value}; "
    "email@example.org; https://example.com/path?q=1&r=2; 50% off; $19.99; #hashtag; @mention.",
    "Tensors flow through the layers of the network: an embedding, then attention, then a feed-forward block, "
    "repeated many times, and finally a projection back onto the vocabulary to predict the next token.",
)

_SYLLABLES = ("ka", "ro", "mi", "ten", "sul", "da", "ve", "lor", "ith", "ban", "qu", "ez", "pra", "nov", "gil",
              "sha", "tor", "ul", "wen", "xi", "yar", "zo", "fle", "cra", "dun", "hem", "jo", "pli", "str", "ock")


def corpus(pseudo_words: int = 0, seed: int = 0) -> list[str]:
    """The built-in paragraphs, then ``pseudo_words`` generated words in lines of twelve (deterministic)."""
    lines = list(PARAGRAPHS)
    rng = random.Random(seed)
    words: list[str] = []
    for _ in range(pseudo_words):
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        words.append(word.capitalize() if rng.random() < 0.1 else word)
        if len(words) == 12:
            lines.append(" ".join(words) + ".")
            words = []
    if words:
        lines.append(" ".join(words) + ".")
    return lines
