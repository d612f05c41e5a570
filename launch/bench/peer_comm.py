#!/usr/bin/env python3
"""launch/bench/peer_comm.py — torch.distributed's all-gather and reduce-scatter at the sizes
of fathom's FSDP units: the peer of `fathom bench --cases comm` (launch/bench_comm.c), on the
same GPUs in the same run.

  torchrun --standalone --nproc_per_node D launch/bench/peer_comm.py [--repeat 10]
  python3 launch/bench/peer_comm.py --sizes      (the units' sizes alone; no torch needed)

Units, as fathom shards them (runtime/fsdp.c): every tensor along its first dimension,
padded to a multiple of D. PyTorch moves a unit the way FSDP2 does: one
all_gather_into_tensor of the concatenated bf16 shards, one reduce_scatter_tensor of the fp32
gradients (without FSDP2's copies in and out, so it is the collective alone). Each time is
the median over --repeat (after two warm-ups) of the slowest rank's CUDA-event time of one
collective started after a barrier; bus bandwidth as nccl-tests and fathom count it:
(D - 1) / D x the full unit's bytes / time. Rank 0 prints one JSON line a result and a
table.
"""

import argparse
import json
import os

# (name, model) of each unit, in fathom's order: d, n_heads, n_kv_heads, head_dim, ffn, vocab
MODELS = {
    "1B": (1280, 16, 8, 80, 5120, 128256),
    "8B": (4096, 32, 8, 128, 14336, 128256),
}
UNITS = [("1B layer", "1B", "layer"), ("8B layer", "8B", "layer"),
         ("8B embedding", "8B", "embedding")]


def unit_tensors(model, kind):
    """The [rows, columns] of each tensor of a unit (model/params.c's order)."""
    d, heads, kv_heads, head_dim, ffn, vocab = MODELS[model]
    if kind == "embedding":
        return [(vocab, d)]
    return [(d, 1), (heads * head_dim, d), (kv_heads * head_dim, d), (kv_heads * head_dim, d),
            (d, heads * head_dim), (d, 1), (ffn, d), (ffn, d), (d, ffn)]


def shard_elements(model, kind, ranks):
    """Elements of one rank's shards of the unit: ceil(rows / D) rows of each tensor."""
    return sum((rows + ranks - 1) // ranks * columns
               for rows, columns in unit_tensors(model, kind))


def parameters(model, kind):
    return sum(rows * columns for rows, columns in unit_tensors(model, kind))


def median(values):
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


def time_collective(torch, dist, function, repeat):
    """Median over `repeat` of the slowest rank's milliseconds for function()."""
    times = []
    for attempt in range(repeat + 2):
        torch.cuda.synchronize()
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        slowest = torch.tensor([start.elapsed_time(end)], device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if attempt >= 2:
            times.append(slowest.item())
    return median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--sizes", action="store_true",
                        help="print each unit's parameters and shard sizes for D = 2, 4, 8")
    arguments = parser.parse_args()
    if arguments.sizes:
        for name, model, kind in UNITS:
            shards = ", ".join(f"D {ranks}: {shard_elements(model, kind, ranks)}"
                               for ranks in (2, 4, 8))
            print(f"{name}: {parameters(model, kind)} parameters; shard elements {shards}")
        return

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    ranks, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for name, model, kind in UNITS:
        shard = shard_elements(model, kind, ranks)
        shards = torch.randn(shard, device="cuda", dtype=torch.bfloat16)
        full = torch.empty(ranks * shard, device="cuda", dtype=torch.bfloat16)
        gradients = torch.randn(ranks * shard, device="cuda", dtype=torch.float32)
        reduced = torch.empty(shard, device="cuda", dtype=torch.float32)
        cases = [
            ("gather", lambda: dist.all_gather_into_tensor(full, shards), full.numel() * 2),
            ("scatter", lambda: dist.reduce_scatter_tensor(reduced, gradients),
             gradients.numel() * 4),
        ]
        for collective, function, full_bytes in cases:
            ms = time_collective(torch, dist, function, arguments.repeat)
            bus = (ranks - 1) / ranks * full_bytes / (ms * 1e6)
            rows.append((f"{collective} {name}", ms, bus))
            if rank == 0:
                print(json.dumps({"case": "comm", "mode": f"{collective} {name}", "ms": ms,
                                  "rate": bus, "unit": "GB/s bus", "ranks": ranks,
                                  "peer": "torch.distributed " + torch.__version__}),
                      flush=True)
        del shards, full, gradients, reduced
        torch.cuda.empty_cache()
    if rank == 0:
        nccl = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int in older ones
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        print(f"\ntorch.distributed (NCCL {nccl}), {ranks} ranks")
        print(f"{'mode':<22} {'ms':>10} {'GB/s bus':>10}")
        for mode, ms, bus in rows:
            print(f"{mode:<22} {ms:>10.3f} {bus:>10.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
