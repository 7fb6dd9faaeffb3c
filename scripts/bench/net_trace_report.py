#!/usr/bin/env python3
"""Where a small network step's time goes, from a LOOM_NET_TRACE build's timeline.

Build the library with -DLOOM_NET_TRACE=ON, run two processes as two hosts with
LOOM_NET_TRACE_DIR=DIR set, for example

    all_reduce_perf -b 8 -e 8 -c 1 -n 3000 -w 100     (mpirun -np 2, a host each)

and run this script on DIR. It expects that shape: each kernel one block, a first phase
that sends and a second that receives (an all-reduce of a few bytes on 2 ranks). It
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
    v = sorted(x / 1000.0 for x in values)
    v = v[len(v) // 10:]
    if not v:
        return
    n = len(v)
    print(f"  {name:44s} median {v[n // 2]:7.2f}  p10 {v[n // 10]:7.2f}  p90 {v[9 * n // 10]:7.2f}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: net_trace_report.py DIR")
    d = sys.argv[1]
    gpus = sorted(glob.glob(d + "/gpu.*.txt"))
    proxies = sorted(glob.glob(d + "/proxy.*.txt"))
    if len(gpus) != 2 or len(proxies) != 2:
        sys.exit(f"{d}: expected the files of 2 processes, found {len(gpus)} and {len(proxies)}")
    ranks = {}
    for gp, pp in zip(gpus, proxies):
        spread, kernels = load_gpu(gp)
        events = load_proxy(pp)
        if not events:
            sys.exit(f"{pp}: no events")
        rank = 1 - events[0][2]  # its peer's rank is in every event
        ranks[rank] = {"k": kernels, "px": events}
        print(f"{gp}: rank {rank}, {len(kernels)} kernels, clocks paired to +-{spread / 1000:.2f} us")
    for r in (0, 1):
        k, o = ranks[r]["k"], ranks[1 - r]
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
        isend = [t for t, e, _ in ranks[r]["px"] if e == ISEND]
        done = [t for t, e, _ in ranks[r]["px"] if e == SEND_DONE]
        head = [t for t, e, _ in o["px"] if e == RECV_HEAD]
        m = min(n, len(isend), len(done), len(head), len(o["k"]))
        stat("posted -> proxy isends (clocks paired)", [isend[i] - k[i][POSTED] for i in range(m)])
        stat("proxy isend -> send done", [done[i] - isend[i] for i in range(m)])
        stat("proxy isend -> peer's proxy has it", [head[i] - isend[i] for i in range(m)])
        stat("peer's proxy -> peer's kernel has it (paired)",
             [o["k"][i][LATER + GATHERED] - head[i] for i in range(m)])
        stat("posted -> peer's kernel has it", [o["k"][i][LATER + GATHERED] - k[i][POSTED] for i in range(m)])


if __name__ == "__main__":
    main()
