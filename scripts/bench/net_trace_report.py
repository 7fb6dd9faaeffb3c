#!/usr/bin/env python3
"""Where a small network step's time goes, from a LOOM_NET_TRACE build's timeline.

Build the library with -DLOOM_NET_TRACE=ON, run two processes as two hosts with
LOOM_NET_TRACE_DIR=DIR set, for example

    all_reduce_perf -b 8 -e 8 -c 1 -n 3000 -w 100     (mpirun -np 2, a host each)

and run this script on DIR (--direct for the direct all-gather's shape, below). It expects that shape: each kernel one block, a first phase
that sends and a later one that receives, every rank exchanging one message with every
other per call (an all-reduce of a few bytes on 2 ranks, the direct all-gather on 3). It
prints the median, 10th and 90th percentile of each stage, in microseconds, leaving out
the first tenth of the kernels (warm-up).

The files: gpu.PID.txt (the kernel's stamps, GPU global timer: one line per kernel,
"k" then 32 stamps, 0-15 for the first phase and 16-31 for the later ones, and "clock"
lines pairing the GPU timer with the host clock) and proxy.PID.txt (the proxy's events,
host CLOCK_REALTIME: time, event, peer). Stamps across the two clocks are good to about
a microsecond (the "clock" lines' spread, printed).
"""
import glob
import statistics
import sys

# Kernel stamps (net_kernels.cu trace()): index in the first phase; +16 in later ones.
START, SLOT, POSTED, GATHERED, RELEASED, END = 1, 2, 3, 4, 5, 6
POST_BEGIN, REDUCED, PLAN, WAITED, SMALLNESS = 7, 10, 11, 12, 13
LATER = 16
# Proxy events (proxy.cc trace()).
ISEND, SEND_DONE, RECV_HEAD = 11, 12, 13


def load_gpu(path):
    clocks, kernels = [], []
    for line in open(path):
        f = line.split()
        if f[0] == "clock":
            clocks.append(tuple(int(x) for x in f[1:4]))
        elif f[0] == "k":
            kernels.append([int(x) for x in f[1:]])
    offset = statistics.median((a + b) / 2 - g for a, g, b in clocks)
    spread = statistics.median((b - a) / 2 for a, g, b in clocks)
    # Host time of each stamp (0 stays 0: not stamped).
    kernels = [[k[0]] + [t + offset if t else 0 for t in k[1:]] for k in kernels]
    return spread, kernels


def load_proxy(path):
    return [tuple(int(x) for x in line.split()) for line in open(path)]


def stat(name, values):
    # (A stage whose stamp was not taken, 0, gives a value far out: left out.)
    v = sorted(x / 1000.0 for x in values if -1e9 < x < 1e9)
    v = v[len(v) // 10:]
    if not v:
        return
    n = len(v)
    # The mean too: where the GPU's timer ticks coarsely, a median of short stages rounds
    # to a tick; the mean over many kernels, whose phases against the tick vary, does not.
    print(f"  {name:44s} median {v[n // 2]:7.2f}  mean {sum(v) / n:7.2f}  p10 {v[n // 10]:7.2f}"
          f"  p90 {v[9 * n // 10]:7.2f}")


def by_kernel(records):
    """Kernels of several blocks: the i-th record of each block index belongs to kernel i."""
    blocks = {}
    for rec in records:
        blocks.setdefault(rec[0], []).append(rec)
    n = min(len(v) for v in blocks.values())
    return [{b: blocks[b][i] for b in blocks} for i in range(n)], sorted(blocks)


def direct_report(ranks, nranks):
    """The direct exchange's shape (a direct all-gather or all-to-all of one size and one
    lane, messages of at most 1 KiB): one phase, block 0 copies this rank's own block,
    block 2k-1 sends to rank r+k and block 2k receives from rank r-k (k = 1 .. n-1). Trace
    only that call: kernels of another shape break the pairing of records into kernels."""
    kernels = {r: by_kernel(ranks[r]["k"])[0] for r in ranks}
    if any(not k for k in kernels.values()):
        sys.exit("a rank has no kernels in the trace")
    for r in range(nranks):
        ks = kernels[r]
        print(f"rank {r} ({len(ks)} kernels of {len(ks[0])} blocks):")
        start = [min(x[START] for x in k.values()) for k in ks]
        stat("kernel start -> last block's start", [max(x[START] for x in k.values()) - s0 for k, s0 in zip(ks, start)])
        stat("kernel start -> last block's end", [max(x[END] for x in k.values()) - s0 for k, s0 in zip(ks, start)])
        stat("kernel start -> next kernel start", [start[i + 1] - start[i] for i in range(len(ks) - 1)])
        for k in range(1, nranks):
            to, frm = (r + k) % nranks, (r - k) % nranks
            sb, rb = 2 * k - 1, 2 * k
            stat(f"block {sb} (to {to}): kernel start -> posted", [x[sb][POSTED] - s0 for x, s0 in zip(ks, start)])
            stat(f"block {rb} (from {frm}): kernel start -> gathered",
                 [x[rb][GATHERED] - s0 for x, s0 in zip(ks, start)])
            isend = [t for t, e, q in ranks[r]["px"] if e == ISEND and q == to]
            head = [t for t, e, q in ranks[to]["px"] if e == RECV_HEAD and q == r]
            theirs = kernels[to]
            # The block of `to` that receives from r: r = to - k'.
            kk = (to - r) % nranks
            m = min(len(ks), len(isend), len(head), len(theirs))
            print(f"  to rank {to}:")
            stat("posted -> proxy isends (clocks paired)", [isend[i] - ks[i][sb][POSTED] for i in range(m)])
            stat("proxy isend -> peer's proxy has it", [head[i] - isend[i] for i in range(m)])
            stat("peer's proxy -> peer's block has it (paired)",
                 [theirs[i][2 * kk][GATHERED] - head[i] for i in range(m)])


def main():
    args = [a for a in sys.argv[1:] if a != "--direct"]
    direct = len(args) != len(sys.argv) - 1
    if len(args) != 1:
        sys.exit("usage: net_trace_report.py [--direct] DIR")
    d = args[0]
    gpus = sorted(glob.glob(d + "/gpu.*.txt"))
    proxies = sorted(glob.glob(d + "/proxy.*.txt"))
    if len(gpus) < 2 or len(gpus) != len(proxies):
        sys.exit(f"{d}: expected the files of 2 or more processes, found {len(gpus)} and {len(proxies)}")
    nranks = len(gpus)
    ranks = {}
    for gp, pp in zip(gpus, proxies):
        spread, kernels = load_gpu(gp)
        events = load_proxy(pp)
        if not events:
            sys.exit(f"{pp}: no events")
        # Every rank talks to every other one (the shapes this reads): its rank is the one
        # missing from its events' peers.
        missing = set(range(nranks)) - {e[2] for e in events}
        if len(missing) != 1:
            sys.exit(f"{pp}: its peers {sorted({e[2] for e in events})} do not name its rank")
        rank = missing.pop()
        ranks[rank] = {"k": kernels, "px": events}
        print(f"{gp}: rank {rank}, {len(kernels)} kernels, clocks paired to +-{spread / 1000:.2f} us")
    if direct:
        direct_report(ranks, nranks)
        return
    for r in range(nranks):
        k = ranks[r]["k"]
        n = len(k)
        print(f"rank {r}:")
        stat("kernel start -> plan read", [x[PLAN] - x[START] for x in k])
        stat("plan read -> previous kernel done (wait)", [x[WAITED] - x[PLAN] for x in k])
        stat("wait -> step set up", [x[SMALLNESS] - x[WAITED] for x in k])
        stat("set up -> send slot free", [x[SLOT] - x[SMALLNESS] for x in k])
        stat("send slot -> data combined", [x[REDUCED] - x[SLOT] for x in k])
        stat("combined -> posting", [x[POST_BEGIN] - x[REDUCED] for x in k])
        stat("posting -> posted", [x[POSTED] - x[POST_BEGIN] for x in k])
        stat("posted -> receive step set up", [x[LATER + SLOT] - x[POSTED] for x in k])
        stat("receive set up -> message gathered", [x[LATER + GATHERED] - x[LATER + SLOT] for x in k])
        stat("gathered -> combined", [x[LATER + REDUCED] - x[LATER + GATHERED] for x in k])
        stat("combined -> released", [x[LATER + RELEASED] - x[LATER + REDUCED] for x in k])
        stat("released -> kernel end", [x[END] - x[LATER + RELEASED] for x in k])
        stat("kernel end -> next kernel past its wait", [k[i + 1][WAITED] - k[i][END] for i in range(n - 1)])
        stat("kernel start -> next kernel start", [k[i + 1][START] - k[i][START] for i in range(n - 1)])
        for p in range(nranks):
            if p == r:
                continue
            o = ranks[p]
            # One message each way per call: the i-th of each list belong to call i.
            isend = [t for t, e, q in ranks[r]["px"] if e == ISEND and q == p]
            done = [t for t, e, q in ranks[r]["px"] if e == SEND_DONE and q == p]
            head = [t for t, e, q in o["px"] if e == RECV_HEAD and q == r]
            m = min(n, len(isend), len(done), len(head), len(o["k"]))
            print(f"  to rank {p}:")
            stat("posted -> proxy isends (clocks paired)", [isend[i] - k[i][POSTED] for i in range(m)])
            stat("proxy isend -> send done", [done[i] - isend[i] for i in range(m)])
            stat("proxy isend -> peer's proxy has it", [head[i] - isend[i] for i in range(m)])
            stat("peer's proxy -> peer's kernel has all (paired)",
                 [o["k"][i][LATER + GATHERED] - head[i] for i in range(m)])
            stat("posted -> peer's kernel has all", [o["k"][i][LATER + GATHERED] - k[i][POSTED] for i in range(m)])


if __name__ == "__main__":
    main()
