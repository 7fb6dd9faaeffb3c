"""PyTorch's NCCL backend on loom: every collective torch.distributed offers, checked
against values known exactly, then (with --bench) a few timed all-reduces.

Run by tests/gpu/torch_smoke.sh, one process per GPU under torch.distributed.run, with
loom's libnccl.so.2 preloaded (or without it, to time the NCCL PyTorch ships). With
--as-hosts every process claims a host of its own (LOOM_HOST_ID / NCCL_HOSTID) and the
processes share the GPUs there are, so that every byte crosses the network transports.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", action="store_true", help="also time all_reduce and DDP steps")
    parser.add_argument("--as-hosts", action="store_true",
                        help="each process a host of its own, the GPUs shared round-robin")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = rank
    if args.as_hosts:
        # Read by both libraries when the communicator is made, which is after this.
        os.environ["LOOM_HOST_ID"] = os.environ["NCCL_HOSTID"] = f"host{rank}"
        local = rank % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    failures = []

    def check(name, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            bad = (got.cpu() != want.cpu()).nonzero()
            failures.append(f"{name}: {bad.numel()} wrong, first at {bad[0].tolist()}")

    def pattern(n, r, dtype=torch.float32):
        # Small integers: sums over a few ranks are exact in every type used here.
        return ((torch.arange(n, device=dev) * 7 + r * 3) % 13 + 1).to(dtype)

    ranks_sum = lambda n, dtype: sum(pattern(n, r, dtype) for r in range(world))

    for n in [1, 1000, (1 << 20) + 3, 1 << 21, 1 << 24]:  # up to 64 MiB of float
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            if dtype != torch.float32 and n > (1 << 21):
                continue
            x = pattern(n, rank, dtype)
            dist.all_reduce(x)
            check(f"all_reduce sum {n} {dtype}", x, ranks_sum(n, dtype))
        x = pattern(n, rank)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        check(f"all_reduce max {n}", x, torch.stack([pattern(n, r) for r in range(world)]).amax(0))
    for root in range(world):
        n = (1 << 22) + 1
        x = pattern(n, rank)
        dist.reduce(x, dst=root)
        if rank == root:
            check(f"reduce to {root}", x, ranks_sum(n, torch.float32))
        x = pattern(n, rank) if rank == root else torch.zeros(n, device=dev)
        dist.broadcast(x, src=root)
        check(f"broadcast from {root}", x, pattern(n, root))
    n = 1 << 20
    out = torch.empty(n * world, device=dev)
    dist.all_gather_into_tensor(out, pattern(n, rank))
    check("all_gather", out, torch.cat([pattern(n, r) for r in range(world)]))
    inp = torch.cat([pattern(n, rank) + 100 * q for q in range(world)])
    out = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(out, inp)
    check("reduce_scatter", out, ranks_sum(n, torch.float32) + 100 * rank * world)
    inp = torch.cat([pattern(n, rank) + 1000 * q for q in range(world)])
    out = torch.empty(n * world, device=dev)
    dist.all_to_all_single(out, inp)
    check("all_to_all", out, torch.cat([pattern(n, r) + 1000 * rank for r in range(world)]))
    peer = (rank + 1) % world
    src = (rank - 1) % world
    got = torch.empty(n, device=dev)
    ops = [dist.P2POp(dist.isend, pattern(n, rank), peer), dist.P2POp(dist.irecv, got, src)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("send/recv", got, pattern(n, src))
    dist.barrier()
    torch.cuda.synchronize()
    print(f"rank {rank}: {len(failures)} failure(s) {failures}", flush=True)

    if args.bench:
        for n in [1 << 11, 1 << 22, 1 << 25]:  # 8 KiB, 16 MiB, 128 MiB of float
            x = pattern(n, rank)
            iters = 200 if n < (1 << 26) else 20
            for _ in range(10):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / iters * 1e6
            if rank == 0:
                print(f"bench all_reduce {n * 4} bytes: {us:.1f} us per call, "
                      f"busbw {n * 4 / us / 1e3 * 2 * (world - 1) / world:.2f} GB/s", flush=True)
        # DDP: a 4-layer MLP of 2048 wide (16.8 M parameters, 67 MB of float gradients in
        # PyTorch's 25 MB buckets), forward, backward and SGD step, 5 untimed then 20 timed.
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        batch = torch.randn(64, 2048, device=dev)
        for step in range(25):
            if step == 5:
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
            opt.zero_grad()
            ddp(batch).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 20 * 1e3
        # The replicas must agree after the steps (DDP averaged the same gradients).
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        if any(not torch.equal(everyone[0], e) for e in everyone):
            failures.append("ddp: replicas differ after 25 steps")
            print(f"rank {rank}: failure: ddp replicas differ after 25 steps", flush=True)
        if rank == 0:
            print(f"bench ddp step (16.8 M parameters, {world} ranks): {ms:.1f} ms", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
