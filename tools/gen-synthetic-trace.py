#!/usr/bin/env python3
# Writes the synthetic trace of docs/bench/sections/hot28.md to stdout:
#   python3 tools/gen-synthetic-trace.py > /tmp/synthetic.jsonl
# Synthetic trace: 3000 requests over 300 conversations picked uniformly; a request reuses its
# conversation's blocks so far and adds 1-4 new ones. No block is shared across conversations,
# so no block is in more than ~1% of requests (no single hot block).
import json, random
random.seed(28)
turns = {}
for _ in range(3000):
    c = random.randrange(300)
    n = turns.get(c, random.randint(3, 10)) + random.randint(1, 4)
    turns[c] = min(n, 40)
    print(json.dumps({"timestamp": 0, "hash_ids": [c * 1000 + i for i in range(turns[c])]}))
