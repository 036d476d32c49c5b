"""The built-in evaluation set of the ``eval`` stage: multiple-choice questions scored by log-likelihood, and
texts for perplexity. Small and fixed so target and reference see exactly the same inputs; written for
this project."""

from __future__ import annotations

# (question, choices, index of the right answer)
MULTIPLE_CHOICE: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("The capital of France is", ("Paris", "Berlin", "Madrid", "Rome"), 0),
    ("Water freezes at a temperature of", ("zero degrees Celsius", "fifty degrees Celsius",
                                           "one hundred degrees Celsius", "minus eighty degrees Celsius"), 0),
    ("A spider has", ("eight legs", "six legs", "four legs", "ten legs"), 0),
    ("The planet closest to the sun is", ("Mercury", "Jupiter", "Neptune", "Saturn"), 0),
    ("Two plus two equals", ("four", "five", "three", "twenty-two"), 0),
    ("The opposite of hot is", ("cold", "loud", "tall", "heavy"), 0),
    ("Bread is made mainly from", ("flour", "stone", "glass", "copper"), 0),
    ("A week has", ("seven days", "ten days", "three days", "twelve days"), 0),
    ("The sun rises in the", ("east", "west", "north", "basement"), 0),
    ("Ice is the solid form of", ("water", "sand", "iron", "smoke"), 0),
    ("Fish breathe with their", ("gills", "wheels", "feathers", "antlers"), 0),
    ("The largest ocean on Earth is the", ("Pacific Ocean", "Arctic Ocean", "Indian Ocean", "Atlantic Ocean"), 0),
    ("A baker mostly works with", ("dough", "bricks", "cables", "engines"), 0),
    ("Rivers flow towards the", ("sea", "sky", "mountain tops", "moon"), 0),
    ("The colour of a clear daytime sky is", ("blue", "green", "purple", "black"), 0),
    ("Ten divided by two is", ("five", "eight", "twenty", "one"), 0),
)

PERPLEXITY_TEXTS: tuple[str, ...] = (
    "Rivers carry sand and silt from the mountains to the sea. Over thousands of years the sediment builds "
    "deltas, wide flat plains where the river splits into many small channels.",
    "The committee met on Tuesday to discuss the budget. After a long debate they agreed to repair the bridge "
    "first and to postpone the new playground until the spring.",
    "def mean(values):\n    return sum(values) / len(values)\n\nprint(mean([1, 2, 3, 4]))\n",
)
