"""The confirmation run: a plan of arms from what was seen, the servers it starts, the verdict."""
