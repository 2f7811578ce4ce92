"""How fast the simulator's engine and radix tree are, on one core, against named peers.

Two questions:

1. Engine: requests/s and decode tokens/s the scheduler sustains with ``step_time_s=0`` (no
   emulated GPU time, so the figure is pure simulator overhead). Peer: the emulated GPU step the
   simulator pretends to run by default (2 ms per scheduler step); the overhead per step says how
   much of a default run is the simulator rather than the emulated GPU.
2. Tree: building a 100,000-node :class:`radixtop.sim.radix.RadixCache` by inserts, and one full
   walk of it (what an instrumentation snapshot does). Peer: a per-token nested-dict trie, the
   plain-Python structure one would write first, built from the same sequences and walked the same
   way.

Usage::

    python benchmarks/sim_bench.py            # short mode (a few seconds)
    python benchmarks/sim_bench.py --full     # the figures written down: more requests, 3 repeats
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench_rows import row  # noqa: E402  (benchmarks/ is the script's own directory)

from radixtop.sim.engine import Engine, SimConfig  # noqa: E402
from radixtop.sim.radix import InsertParams, RadixCache, RadixKey  # noqa: E402


def engine_run(num_requests: int, prompt_len: int, max_new: int, page_size: int) -> dict[str, float]:
    rng = random.Random(1)
    # Eight families sharing a 128-token system prompt, private tails: realistic cache hits.
    bases = [[7_000_000 + f] + [rng.randrange(1 << 20) for _ in range(127)] for f in range(8)]
    prompts = [
        bases[i % 8] + [rng.randrange(1 << 20) for _ in range(prompt_len - 128)] for i in range(num_requests)
    ]
    lines: list[str] = []
    config = SimConfig(step_time_s=0, page_size=page_size, max_total_tokens=65536, max_running_requests=32)
    engine = Engine(config, lines.append)

    async def main() -> tuple[float, int, int]:
        task = asyncio.create_task(engine.run())
        await asyncio.sleep(0)
        start_iter = engine.iteration
        t0 = time.process_time()  # CPU seconds: the figure a shared 2-core box can still measure
        results = await asyncio.gather(*[engine.generate(p, max_new_tokens=max_new) for p in prompts])
        elapsed = time.process_time() - t0
        steps = engine.iteration - start_iter
        engine.stop()
        await task
        return elapsed, sum(r.completion_tokens for r in results), steps

    elapsed, tokens, steps = asyncio.run(main())
    return {
        "requests_per_s": num_requests / elapsed,
        "decode_tokens_per_s": tokens / elapsed,
        "ms_per_step": elapsed / steps * 1000,
        "steps": steps,
        "elapsed_s": elapsed,
    }


def tree_sequences(count: int, seed: int = 2) -> list[list[int]]:
    """Sequences that make a branching tree: most share a random prefix of an earlier one."""
    rng = random.Random(seed)
    seqs: list[list[int]] = []
    for _ in range(count):
        if seqs and rng.random() < 0.9:
            parent = seqs[rng.randrange(len(seqs))]
            cut = rng.randrange(1, len(parent))
            seq = parent[:cut] + [rng.randrange(1 << 20) for _ in range(rng.randrange(4, 24))]
        else:
            seq = [rng.randrange(1 << 20) for _ in range(rng.randrange(8, 40))]
        seqs.append(seq)
    return seqs


def tree_bench(target_nodes: int) -> dict[str, float]:
    # Each insert adds a leaf and often splits a node: about 1.6 nodes per sequence here;
    # insert in batches until the tree has target_nodes nodes (the counting walks are not timed).
    seqs = tree_sequences(int(target_nodes / 1.5))
    cache = RadixCache.create_simulated()  # no pool: values fall back to the token ids
    insert_s = 0.0
    used = 0
    while used < len(seqs):
        batch = seqs[used : used + 5000]
        t0 = time.process_time()
        for seq in batch:
            cache.insert(InsertParams(key=RadixKey(seq)))
        insert_s += time.process_time() - t0
        used += len(batch)
        if sum(1 for _ in cache.iter_nodes()) + 1 >= target_nodes:
            break
    seqs = seqs[:used]
    t0 = time.process_time()
    nodes = tokens = 0
    hist: dict[int, int] = {}
    stack = [cache.root_node]
    while stack:  # a snapshot-style walk: visit, read the fields a snapshot reads
        node = stack.pop()
        nodes += 1
        tokens += len(node.key)
        hist[node.lock_ref] = hist.get(node.lock_ref, 0) + 1
        _ = (node.id, node.last_access_time, node.hit_count, node.value is None)
        stack.extend(node.children.values())
    walk_s = time.process_time() - t0

    # Peer: a per-token nested-dict trie of the same sequences.
    t0 = time.process_time()
    trie: dict = {}
    for seq in seqs:
        cur = trie
        for tok in seq:
            cur = cur.setdefault(tok, {})
    peer_insert_s = time.process_time() - t0
    t0 = time.process_time()
    peer_nodes = 0
    pstack = [trie]
    while pstack:
        cur = pstack.pop()
        peer_nodes += 1
        pstack.extend(cur.values())
    peer_walk_s = time.process_time() - t0
    return {
        "sequences": len(seqs),
        "nodes": nodes,
        "tokens": tokens,
        "insert_s": insert_s,
        "insert_us_per_seq": insert_s / len(seqs) * 1e6,
        "walk_s": walk_s,
        "peer_nodes": peer_nodes,
        "peer_insert_s": peer_insert_s,
        "peer_walk_s": peer_walk_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="more requests and 3 repeats (minutes)")
    args = parser.parse_args()
    repeats = 3 if args.full else 1
    num_requests = 1024 if args.full else 192
    print(
        f"python {platform.python_version()} on {platform.machine()}, {'full' if args.full else 'short'} mode; "
        "times are CPU seconds of this process (one core)"
    )

    for page_size in (1, 64):
        runs = [engine_run(num_requests, 512, 64, page_size) for _ in range(repeats)]
        best = max(runs, key=lambda r: r["requests_per_s"])
        print(
            f"engine page_size={page_size:<3} {num_requests} reqs x (512 prompt, 64 new), 32 running: "
            f"{best['requests_per_s']:.0f} req/s, {best['decode_tokens_per_s']:.0f} decode tok/s, "
            f"{best['ms_per_step']:.3f} ms/step over {best['steps']} steps "
            f"(peer: the emulated GPU step, 2.000 ms: sim overhead {best['ms_per_step'] / 2.0 * 100:.0f}% of it)"
        )
        row(f"simulator engine, page size {page_size}, CPU ms per scheduler step at step_time_s=0",
            f"{best['ms_per_step']:.2f} ms ({best['requests_per_s']:.0f} requests/s)", "emulated GPU step: 2.000 ms")

    runs = [tree_bench(100_000) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["insert_s"])
    print(
        f"tree: {best['nodes']} nodes ({best['tokens']} tokens) from {best['sequences']} inserts: "
        f"insert {best['insert_s']:.2f} s ({best['insert_us_per_seq']:.1f} us/insert), "
        f"full walk {best['walk_s'] * 1000:.0f} ms"
    )
    print(
        f"peer (per-token nested-dict trie, {best['peer_nodes']} nodes): insert {best['peer_insert_s']:.2f} s, "
        f"walk {best['peer_walk_s'] * 1000:.0f} ms "
        f"(radix/peer: insert {best['insert_s'] / best['peer_insert_s']:.2f}x, "
        f"walk {best['walk_s'] / best['peer_walk_s']:.2f}x)"
    )
    row(f"{best['nodes']:,}-node radix tree: build / full walk",
        f"{best['insert_s']:.2f} s ({best['insert_us_per_seq']:.0f} us per insert) / {best['walk_s'] * 1000:.0f} ms",
        f"nested-dict trie, {best['peer_nodes']:,} nodes: "
        f"{best['peer_insert_s']:.2f} s / {best['peer_walk_s'] * 1000:.0f} ms")
    if repeats > 1:
        spread = [r["insert_s"] for r in runs]
        print(f"tree insert over {repeats} runs: min {min(spread):.2f} s, max {max(spread):.2f} s")


if __name__ == "__main__":
    main()
