// Every environment variable loom reads, once: X(use, handle, name, NCCL alias, type,
// default, words, doc). common/settings.h turns each line into a typed handle
// (settings::kTimeoutMs, ...) through which code reads it, and settings.cc into the
// registry's table (loom-settings prints it, docs/environment.md is written from it).
// Keep it grouped by component.
#pragma once

// clang-format off
#define LOOM_SETTINGS(X) \
  /* logging */ \
  X(kUser, kDebug, "LOOM_DEBUG", "NCCL_DEBUG", kChoice, "WARN", \
    "NONE|VERSION|WARN|INFO|ABORT|TRACE", "log level (any case; ABORT is taken as TRACE)") \
  X(kUser, kDebugSubsys, "LOOM_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", kString, "INIT,ENV", "", \
    "log subsystems: INIT,COLL,P2P,SHM,NET,BOOTSTRAP,GRAPH,TUNING,ENV,ALL (^ excludes)") \
  X(kUser, kDebugFile, "LOOM_DEBUG_FILE", "NCCL_DEBUG_FILE", kString, "", "", \
    "write the log to this file instead of stderr (%h host, %p pid, %r rank)") \
  /* communicator */ \
  X(kUser, kCommId, "LOOM_COMM_ID", "NCCL_COMM_ID", kString, "", "", \
    "host:port of the bootstrap root (ncclGetUniqueId then names it instead of listening)") \
  X(kUser, kCommSecret, "LOOM_COMM_SECRET", nullptr, kString, "", "", \
    "with LOOM_COMM_ID (or MASTER_ADDR): a secret every rank shares (the launcher's job id, " \
    "a random token), without which anyone who can reach the root's port can join") \
  X(kUser, kTimeoutMs, "LOOM_TIMEOUT_MS", nullptr, kInt, "300000", "", \
    "milliseconds any wait on a peer may take before the operation fails; the error then " \
    "names the peer and says where every rank is (the call it is in, or that it never came, " \
    "stopped answering or is gone)") \
  X(kUser, kDevice, "LOOM_DEVICE", nullptr, kChoice, "auto", "auto|cpu", \
    "memory kind of communicators: auto (GPU when present), cpu (host memory)") \
  X(kUser, kHostId, "LOOM_HOST_ID", "NCCL_HOSTID", kString, "", "", \
    "override the host identity (ranks with the same id share memory)") \
  /* topology */ \
  X(kUser, kTopoFile, "LOOM_TOPO_FILE", "NCCL_TOPO_FILE", kString, "", "", \
    "NCCL topology XML laid over detection (the file wins where both describe a device)") \
  X(kUser, kTopoDumpFile, "LOOM_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE", kString, "", "", \
    "write each host's topology as NCCL XML here at init (%h host, %r rank, %p pid)") \
  X(kUser, kGraphDumpFile, "LOOM_GRAPH_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE", kString, "", "", \
    "rank 0 writes the chosen rings and trees here as JSON at init (%h, %r, %p)") \
  /* transports */ \
  X(kTuning, kTransports, "LOOM_TRANSPORTS", nullptr, kString, "", "", \
    "comma list of transports allowed, in order of preference (self,p2p,shm,net,tcp; net: the ib backend between hosts)") \
  X(kUser, kShmDisable, "LOOM_SHM_DISABLE", "NCCL_SHM_DISABLE", kBool, "0", "", \
    "never use shared memory between processes") \
  X(kUser, kP2pDisable, "LOOM_P2P_DISABLE", "NCCL_P2P_DISABLE", kBool, "0", "", \
    "never use GPU peer-to-peer (device buffers then go through host memory)") \
  X(kTuning, kP2pBlocks, "LOOM_P2P_BLOCKS", "NCCL_MAX_NCHANNELS", kCount, "auto", "auto", \
    "CUDA blocks (channels) of the GPU mesh kernels, each with its own slots per peer, 1 to " \
    "128 (auto: 128 for 2 ranks, 64 above; measured on 2 x H200, docs/perf/h200x2.md)") \
  X(kTuning, kP2pShareGpu, "LOOM_P2P_SHARE_GPU", nullptr, kBool, "0", "", \
    "let ranks of one process share a GPU in the peer-to-peer mesh (to test the kernels for " \
    "more ranks than there are GPUs; slow): blocks are capped so that every rank's kernel fits " \
    "on the GPU at once, and programmatic dependent launch is off") \
  X(kTuning, kP2pShareGpuGate, "LOOM_P2P_SHARE_GPU_GATE", nullptr, kBool, "1", "", \
    "with LOOM_P2P_SHARE_GPU, where all of a host's ranks are in one process: a " \
    "hierarchical call's rank enqueues each pass (mesh, rail, copy) only once every rank of " \
    "its host has enqueued the one before (streams on one GPU may share an in-order " \
    "hardware queue; 0: off, to compare)") \
  X(kTuning, kP2pThreads, "LOOM_P2P_THREADS", "NCCL_NTHREADS", kInt, "512", "", \
    "threads per block of the GPU mesh kernels") \
  X(kTuning, kPdl, "LOOM_PDL", nullptr, kBool, "1", "", \
    "launch the GPU mesh kernels with programmatic dependent launch where device and build are " \
    "compute capability 9.0+: the next call's kernel is scheduled near the end of the current " \
    "one and waits for it on the GPU") \
  X(kTuning, kP2pSlots, "LOOM_P2P_SLOTS", nullptr, kInt, "4", "", \
    "slots per peer and block in the GPU mesh window") \
  X(kTuning, kP2pSlotBytes, "LOOM_P2P_SLOT_BYTES", nullptr, kSize, "auto", "auto", \
    "bytes per slot of the GPU mesh window (auto: 256 KiB for 2 ranks, 128 KiB up to 4, 64 KiB " \
    "above)") \
  X(kTuning, kP2pOneshotBytes, "LOOM_P2P_ONESHOT_BYTES", nullptr, kSize, "auto", "auto|off", \
    "GPU all-reduce: one-shot up to this size, two-shot above (auto: 4 MiB for 2 ranks, 256 " \
    "KiB above)") \
  X(kTuning, kP2pCeBytes, "LOOM_P2P_CE_BYTES", nullptr, kSize, "auto", "auto|off", \
    "GPU broadcast, all-gather and all-to-all with every rank in one process: copy engines " \
    "from this many bytes per copy (auto: 16 MiB)") \
  X(kTuning, kP2pPullBytes, "LOOM_P2P_PULL_BYTES", nullptr, kSize, "64M", "off", \
    "GPU all-reduce between ranks of one process whose calls meet in a group or between " \
    "processes on registered memory (ncclCommRegister): each rank reads its part of every " \
    "input directly and stores the result into every output (two-shot; one-shot, each rank " \
    "reading every input, where a peer's output cannot be written), above the LL limit and " \
    "up to this size") \
  X(kTuning, kP2pCePullBytes, "LOOM_P2P_CE_PULL_BYTES", nullptr, kSize, "16M", "off", \
    "GPU all-gather, broadcast and all-to-all between 2 processes on registered memory: each " \
    "rank's copy engine pulls the peers' blocks from this many bytes per block, within the " \
    "sizes where that measured faster") \
  X(kTuning, kP2pPullReduceBytes, "LOOM_P2P_PULL_REDUCE_BYTES", nullptr, kSize, "any", "any|off", \
    "GPU reduce between processes on registered memory (ncclCommRegister): the root reads " \
    "every input directly, above the LL limit and up to this size") \
  X(kTuning, kP2pTwoshotReduceBytes, "LOOM_P2P_TWOSHOT_REDUCE_BYTES", nullptr, kSize, "off", "off", \
    "GPU reduce between ranks of one process whose calls meet in a group: above the LL limit " \
    "and up to this size, each rank reduces its part of every input and stores it into the " \
    "root's output (two-shot; ahead of the copy engines' form; not with LOOM_ALGO set; off " \
    "until measured on 2 x H200)") \
  X(kTuning, kP2pCeReduceBytes, "LOOM_P2P_CE_REDUCE_BYTES", nullptr, kSize, "auto", "auto|off", \
    "GPU reduce between ranks of one process whose calls meet in a group: from this size the " \
    "copy engines move the data in chunks and kernels reduce each chunk locally (auto: 2 MiB " \
    "on 2 ranks, never on more)") \
  X(kTuning, kP2pCeAllreduceBytes, "LOOM_P2P_CE_ALLREDUCE_BYTES", nullptr, kSize, "auto", "auto|off", \
    "the same chunked form for all-reduce, from this size (auto: 256 MiB on 2 ranks, never on " \
    "more)") \
  X(kTuning, kP2pCeChunkBytes, "LOOM_P2P_CE_CHUNK_BYTES", nullptr, kSize, "auto", "auto", \
    "chunk size of the copy-engine reduce and all-reduce, for measurements (auto: a whole slot " \
    "for reduce, 64 MiB for all-reduce)") \
  X(kTuning, kP2pCeScratchBytes, "LOOM_P2P_CE_SCRATCH_BYTES", nullptr, kSize, "256M", "", \
    "device memory per GPU for the chunks of those forms (per peer: two slots for reduce, four " \
    "for all-reduce where each holds 64 MiB), allocated at their first use") \
  X(kTuning, kP2pReduceDirectBytes, "LOOM_P2P_REDUCE_DIRECT_BYTES", nullptr, kSize, "2M", "off", \
    "GPU reduce on 2 ranks: the input straight to the root up to this size, reduce-scatter + " \
    "gather above") \
  X(kTuning, kP2pLlBytes, "LOOM_P2P_LL_BYTES", nullptr, kSize, "auto", "auto|off", \
    "GPU all-reduce, reduce and reduce-scatter: the LL one-shot (flags inside the data) while " \
    "what a rank sends each peer (the input; a reduce-scatter's part per rank) is at most this " \
    "(at most 1 MiB; auto: 1 MiB on 2 ranks, 256 KiB above)") \
  X(kTuning, kP2pLl128Bytes, "LOOM_P2P_LL128_BYTES", nullptr, kSize, "off", "off", \
    "GPU all-reduce, reduce and reduce-scatter: the LL128 one-shot (120 data bytes and a flag per " \
    "128-byte line) above the LL limit while what a rank sends each peer is at most this (at " \
    "most 8,601,600 bytes on 2 ranks, 2,211,840 above; off by default: slower than the " \
    "other forms at most sizes on 2 x H200; needs NVLink between the GPUs)") \
  X(kUser, kNet, "LOOM_NET", "NCCL_NET", kString, "auto", "", \
    "network backend between hosts (any case): auto (IB when an RDMA device is usable, else " \
    "Socket), Socket, IB (an error at init when no RDMA device can be used) or UCX (UCX's UCP, " \
    "its own UCX_* settings choosing how; an error when libucp cannot be loaded), or the name " \
    "of an external plugin that LOOM_NET_PLUGIN loads; host buffers go over IB, UCX and " \
    "plugins too") \
  X(kUser, kNetPlugin, "LOOM_NET_PLUGIN", "NCCL_NET_PLUGIN", kString, "", "", \
    "NCCL network plugins to try, comma-separated: each name as it is and as " \
    "libnccl-net-NAME.so (a path or lib...so as it is); none: no plugin (unset: " \
    "libnccl-net.so where the loader finds one). The first with ncclNetPlugin_v11, v10, v9 " \
    "or v8 whose init succeeds is used before loom's own backends; one that fails is named " \
    "in a warning and loom goes on without it") \
  /* ibverbs (transports/net/ib) */ \
  X(kUser, kIbHca, "LOOM_IB_HCA", "NCCL_IB_HCA", kString, "", "", \
    "RDMA devices to use: prefix list with optional :port (mlx5_0:1,mlx5_1), ^ to exclude, = " \
    "for exact names") \
  X(kUser, kNetGdrLevel, "LOOM_NET_GDR_LEVEL", "NCCL_NET_GDR_LEVEL", kChoice, "PXB", \
    "LOC|PIX|PXB|PHB|SYS", \
    "GPUDirect RDMA: the farthest a NIC may be from the GPU on the PCI tree, in NCCL's terms " \
    "(PIX one PCIe switch, PXB several, PHB through the host bridge, SYS across sockets; LOC: " \
    "never); beyond it GPU buffers go through page-locked host memory") \
  X(kUser, kNetForceFlush, "LOOM_NET_FORCE_FLUSH", "NCCL_NET_FORCE_FLUSH", kBool, "0", "", \
    "GPUDirect RDMA: flush the NIC's writes into GPU memory after every receive " \
    "(cuFlushGPUDirectRDMAWrites) even where the GPU orders them itself (compute 9.0 and later)") \
  X(kUser, kIbGidIndex, "LOOM_IB_GID_INDEX", "NCCL_IB_GID_INDEX", kCount, "auto", "auto", \
    "RoCE: the GID index to use on every port (auto: of LOOM_IB_ADDR_FAMILY inside " \
    "LOOM_IB_ADDR_RANGE, LOOM_IB_ROCE_VERSION_NUM first; else the best other entry)") \
  X(kUser, kIbAddrFamily, "LOOM_IB_ADDR_FAMILY", "NCCL_IB_ADDR_FAMILY", kChoice, "AF_INET", \
    "AF_INET|AF_INET6", \
    "RoCE: the address family of the GID chosen automatically (AF_INET: ::ffff:a.b.c.d; " \
    "AF_INET6: a global IPv6 address)") \
  X(kUser, kIbRoceVersionNum, "LOOM_IB_ROCE_VERSION_NUM", "NCCL_IB_ROCE_VERSION_NUM", kChoice, \
    "2", "1|2", "RoCE: the version the automatic GID choice prefers among those of the family") \
  X(kUser, kIbAddrRange, "LOOM_IB_ADDR_RANGE", "NCCL_IB_ADDR_RANGE", kString, "", "", \
    "RoCE: the automatic GID choice takes addresses in this range first (10.0.0.0/8, " \
    "fd00::/8)") \
  X(kUser, kIbTc, "LOOM_IB_TC", "NCCL_IB_TC", kInt, "0", "", \
    "RoCE traffic class (DSCP << 2) of the connections") \
  X(kUser, kIbSl, "LOOM_IB_SL", "NCCL_IB_SL", kInt, "0", "", \
    "InfiniBand service level of the connections") \
  X(kUser, kIbTimeout, "LOOM_IB_TIMEOUT", "NCCL_IB_TIMEOUT", kInt, "20", "", \
    "ack timeout exponent: a lost packet is resent after 4.096 us x 2^this (20: about 4.3 s)") \
  X(kUser, kIbRetryCnt, "LOOM_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT", kInt, "7", "", \
    "resends of an unacknowledged packet before the connection fails (at most 7)") \
  X(kTuning, kIbQpsPerConnection, "LOOM_IB_QPS_PER_CONNECTION", \
    "NCCL_IB_QPS_PER_CONNECTION", kInt, "1", "", \
    "queue pairs per connection, each carrying an equal share of every message (1 to 8)") \
  X(kTuning, kIbEmulate, "LOOM_IB_EMULATE", nullptr, kString, "", "", \
    "tests only: an emulation of RDMA devices in place of libibverbs, roce[:N] or ib[:N] " \
    "(N devices, default 1), reaching other processes of this machine through Unix sockets; " \
    "with ,gdr its NIC also reads and writes GPU memory (GPUDirect RDMA through CUDA copies)") \
  X(kUser, kSocketIfname, "LOOM_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", kString, "", "", \
    "interfaces for sockets: prefix list, ^ to exclude, = for exact names") \
  X(kUser, kSocketFamily, "LOOM_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY", kChoice, "auto", "auto|AF_INET|AF_INET6", \
    "address family of sockets: auto (either), or AF_INET or AF_INET6 to force one") \
  X(kTuning, kSocketNthreads, "LOOM_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS", kCount, "auto", "auto", \
    "threads per TCP connection (auto: 1 for host buffers; 4 for GPU buffers over the network, " \
    "where the proxy thread moves socket 0 and a helper thread each of the others)") \
  X(kTuning, kNsocksPerthread, "LOOM_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD", kInt, "1", "", \
    "sockets per TCP connection (1 measured best over loopback; more may pay on fast NICs)") \
  X(kTuning, kSocketDuplex, "LOOM_SOCKET_DUPLEX", nullptr, kBool, "1", "", \
    "GPU buffers over sockets: two ranks that need both directions at once share one " \
    "connection, whose first socket (sizes and messages under 64 KiB) carries both ways and " \
    "the others one way each (0: a connection each way, as NCCL's socket transport has it; " \
    "a small message then costs an acknowledgement of its own)") \
  X(kTuning, kUcxLanes, "LOOM_UCX_LANES", nullptr, kCount, "auto", "auto", \
    "UCX workers per connection (at most 16; auto: 1 for host buffers, 2 for GPU buffers): " \
    "lane 0, moved by the proxy thread, carries the sizes and every message under 64 KiB; a " \
    "larger one is cut into a part per further lane, each with a thread of its own (1: the " \
    "proxy moves everything)") \
  X(kTuning, kUcxSpinUs, "LOOM_UCX_SPIN_US", nullptr, kCount, "0", "", \
    "microseconds a ucx lane thread keeps progressing its worker after its last movement " \
    "before it sleeps in poll() (0: sleeps at once; spinning threads take cores from the " \
    "copies where there are few)") \
  X(kTuning, kUcxPrepost, "LOOM_UCX_PREPOST", nullptr, kBool, "no", "", \
    "a receiving ucx connection of 2 lanes posts lane 1's receive of a message when it posts " \
    "the message, while the last message was large, instead of once lane 0 has read its " \
    "size (a guess: a small one's receive is cancelled)") \
  X(kTuning, kUcxLane0Part, "LOOM_UCX_LANE0_PART", nullptr, kBool, "no", "", \
    "lane 0 carries a part of every message of 64 KiB and more beside its size, as the " \
    "further lanes do (no: only the size, so the proxy's thread never waits on a large part); " \
    "every rank must set it alike") \
  X(kTuning, kBuffsize, "LOOM_BUFFSIZE", "NCCL_BUFFSIZE", kSize, "2M", "", \
    "bytes of FIFO per connection of host buffers (split into LOOM_STEPS slots)") \
  X(kTuning, kNetBuffsize, "LOOM_NET_BUFFSIZE", nullptr, kSize, "8M", "", \
    "bytes of FIFO per network connection of GPU buffers (page-locked host memory, split into " \
    "LOOM_STEPS slots; every rank must use the same)") \
  X(kTuning, kNetLanes, "LOOM_NET_LANES", nullptr, kInt, "4", "", \
    "GPU buffers over the network: the most lanes (independent parts of one collective other " \
    "than all-to-all, each with its own connections and CUDA block) per call, 1 to 8") \
  X(kTuning, kNetPdl, "LOOM_NET_PDL", nullptr, kBool, "1", "", \
    "GPU buffers over the network: launch each call's kernel with programmatic dependent " \
    "launch, so that it starts while the stream's previous kernel ends (1-4 us a call on " \
    "small messages; 0: plain launches)") \
  X(kTuning, kProxySpinUs, "LOOM_PROXY_SPIN_US", nullptr, kInt, "5000", "", \
    "microseconds the network proxy thread polls after its last work before it sleeps in 1 ms " \
    "steps (a launch wakes it)") \
  X(kTuning, kSteps, "LOOM_STEPS", nullptr, kInt, "8", "", \
    "slots per connection FIFO") \
  /* collectives */ \
  X(kTuning, kAlgo, "LOOM_ALGO", "NCCL_ALGO", kString, "", "", \
    "force algorithms (NCCL's syntax: a comma list, or ^ and a list to leave out; any case): " \
    "ring, tree (double binary tree), chain, oneshot, twoshot (the ring on host memory), " \
    "doubling (recursive doubling; for all-gather and reduce-scatter, recursive doubling and " \
    "halving on 4 or 8 ranks, taken only where named without ring, direct or hier), direct, or " \
    "hier (across hosts of several ranks each: inside " \
    "each host and between the ranks of one local index; host buffers: all-reduce, " \
    "all-gather and reduce-scatter; GPU buffers: all-reduce, all-gather, broadcast, reduce and " \
    "reduce-scatter; each taken where the cost model prices it " \
    "under the flat form, or always where named; ^hier: never; GPU send/receive and " \
    "all-to-all send messages (all-to-all: blocks) of 512 KiB and more, any where named, to " \
    "the host's own ranks over the GPU mesh and the rest over the network); an unknown name " \
    "fails the communicator's init") \
  X(kTuning, kProto, "LOOM_PROTO", "NCCL_PROTO", kChoice, "auto", "auto|simple|ll|ll128", \
    "force a protocol (any case): simple, ll (GPU all-reduce, reduce and reduce-scatter up to " \
    "1 MiB per peer) or ll128 (up to 8 MiB per peer on 2 ranks, 2 MiB above); auto chooses") \
  X(kTuning, kChunkBytes, "LOOM_CHUNK_BYTES", nullptr, kSize, "auto", "auto", \
    "pipeline chunk size of host collectives, and the piece size of GPU buffers over the " \
    "network (the same on every rank)") \
  X(kTuning, kLaunchThreads, "LOOM_LAUNCH_THREADS", nullptr, kBool, "1", "", \
    "a group that spans several GPU ranks of this process launches each rank's work from its " \
    "own thread, all at once (0: one after another in the calling thread)") \
  X(kTuning, kLaunchSpinUs, "LOOM_LAUNCH_SPIN_US", nullptr, kInt, "500", "", \
    "microseconds those launch threads poll for the next group before they sleep") \
  X(kTuning, kSpinUs, "LOOM_SPIN_US", nullptr, kCount, "auto", "auto", \
    "microseconds to busy-poll before yielding while waiting on a peer (0: yield at once; " \
    "auto: 50 when the communicator's ranks on this host have a CPU each among those " \
    "their affinity allows, 0 otherwise)")
// clang-format on
