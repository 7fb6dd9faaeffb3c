#include "common/settings.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/log.h"

namespace loom::settings {

namespace {

// The one table. Keep it grouped by component; `loom-settings` (tools/) prints it.
const std::vector<Definition> kDefinitions = {
    // logging
    {Use::kUser, "LOOM_DEBUG", "NCCL_DEBUG", Type::kString, "WARN",
     "log level: NONE, VERSION, WARN, INFO, TRACE"},
    {Use::kUser, "LOOM_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", Type::kString, "INIT,ENV",
     "log subsystems: INIT,COLL,P2P,SHM,NET,BOOTSTRAP,GRAPH,TUNING,ENV,ALL (^ excludes)"},
    {Use::kUser, "LOOM_DEBUG_FILE", "NCCL_DEBUG_FILE", Type::kString, "",
     "write the log to this file instead of stderr (%h host, %p pid, %r rank)"},
    // communicator
    {Use::kUser, "LOOM_COMM_ID", "NCCL_COMM_ID", Type::kString, "",
     "host:port of the bootstrap root (ncclGetUniqueId then names it instead of listening)"},
    {Use::kUser, "LOOM_COMM_SECRET", nullptr, Type::kString, "",
     "with LOOM_COMM_ID (or MASTER_ADDR): a secret every rank shares (the launcher's job id, "
     "a random token), without which anyone who can reach the root's port can join"},
    {Use::kUser, "LOOM_TIMEOUT_MS", nullptr, Type::kInt, "300000",
     "milliseconds any wait on a peer may take before the operation fails; the error then "
     "names the peer and says where every rank is (the call it is in, or that it never came, "
     "stopped answering or is gone)"},
    {Use::kUser, "LOOM_DEVICE", nullptr, Type::kString, "auto",
     "memory kind of communicators: auto (GPU when present), cpu (host memory)"},
    {Use::kUser, "LOOM_HOST_ID", "NCCL_HOSTID", Type::kString, "",
     "override the host identity (ranks with the same id share memory)"},
    // topology
    {Use::kUser, "LOOM_TOPO_FILE", "NCCL_TOPO_FILE", Type::kString, "",
     "NCCL topology XML laid over detection (the file wins where both describe a device)"},
    {Use::kUser, "LOOM_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE", Type::kString, "",
     "write each host's topology as NCCL XML here at init (%h host, %r rank, %p pid)"},
    {Use::kUser, "LOOM_GRAPH_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE", Type::kString, "",
     "rank 0 writes the chosen rings and trees here as JSON at init (%h, %r, %p)"},
    // transports
    {Use::kTuning, "LOOM_TRANSPORTS", nullptr, Type::kString, "",
     "comma list of transports allowed, in order of preference (self,p2p,shm,tcp)"},
    {Use::kUser, "LOOM_SHM_DISABLE", "NCCL_SHM_DISABLE", Type::kBool, "0",
     "never use shared memory between processes"},
    {Use::kUser, "LOOM_P2P_DISABLE", "NCCL_P2P_DISABLE", Type::kBool, "0",
     "never use GPU peer-to-peer (device buffers then go through host memory)"},
    {Use::kTuning, "LOOM_P2P_BLOCKS", "NCCL_MAX_NCHANNELS", Type::kInt, "0",
     "CUDA blocks (channels) of the GPU mesh kernels, each with its own slots per peer "
     "(0: 128 for 2 ranks, 64 above; measured on 2 x H200, docs/perf/h200x2.md)"},
    {Use::kTuning, "LOOM_P2P_SHARE_GPU", nullptr, Type::kBool, "0",
     "let ranks of one process share a GPU in the peer-to-peer mesh (to test the kernels for "
     "more ranks than there are GPUs; slow): blocks are capped so that every rank's kernel fits "
     "on the GPU at once, and programmatic dependent launch is off"},
    {Use::kTuning, "LOOM_P2P_THREADS", "NCCL_NTHREADS", Type::kInt, "512",
     "threads per block of the GPU mesh kernels"},
    {Use::kTuning, "LOOM_PDL", nullptr, Type::kBool, "1",
     "launch the GPU mesh kernels with programmatic dependent launch where device and build are "
     "compute capability 9.0+: the next call's kernel is scheduled near the end of the current "
     "one and waits for it on the GPU"},
    {Use::kTuning, "LOOM_P2P_SLOTS", nullptr, Type::kInt, "4", "slots per peer and block in the GPU mesh window"},
    {Use::kTuning, "LOOM_P2P_SLOT_BYTES", nullptr, Type::kInt, "0",
     "bytes per slot of the GPU mesh window (0: 256 KiB for 2 ranks, 128 KiB up to 4, 64 KiB "
     "above)"},
    {Use::kTuning, "LOOM_P2P_ONESHOT_BYTES", nullptr, Type::kInt, "-1",
     "GPU all-reduce: one-shot up to this size, two-shot above (-1: 4 MiB for 2 ranks, 256 KiB "
     "above)"},
    {Use::kTuning, "LOOM_P2P_CE_BYTES", nullptr, Type::kInt, "-1",
     "GPU broadcast, all-gather and all-to-all with every rank in one process: copy engines "
     "from this many bytes per copy (-1: 16 MiB; 0: never)"},
    {Use::kTuning, "LOOM_P2P_PULL_BYTES", nullptr, Type::kInt, "67108864",
     "GPU all-reduce between ranks of one process whose calls meet in a group or between "
     "processes on registered memory (ncclCommRegister): each rank reads its part of every "
     "input directly and stores the result into every output (two-shot; one-shot, each rank "
     "reading every input, where a peer's output cannot be written), above the LL limit and "
     "up to this size (0: never)"},
    {Use::kTuning, "LOOM_P2P_CE_PULL_BYTES", nullptr, Type::kInt, "16777216",
     "GPU all-gather, broadcast and all-to-all between 2 processes on registered memory: each "
     "rank's copy engine pulls the peers' blocks from this many bytes per block, within the "
     "sizes where that measured faster (0: never)"},
    {Use::kTuning, "LOOM_P2P_PULL_REDUCE_BYTES", nullptr, Type::kInt, "-1",
     "GPU reduce between processes on registered memory (ncclCommRegister): the root reads "
     "every input directly, above the LL limit and up to this size (-1: any size; 0: never)"},
    {Use::kTuning, "LOOM_P2P_TWOSHOT_REDUCE_BYTES", nullptr, Type::kInt, "0",
     "GPU reduce between ranks of one process whose calls meet in a group: above the LL limit "
     "and up to this size, each rank reduces its part of every input and stores it into the "
     "root's output (two-shot; ahead of the copy engines' form; not with LOOM_ALGO set; 0: "
     "never, the default until measured on 2 x H200)"},
    {Use::kTuning, "LOOM_P2P_CE_REDUCE_BYTES", nullptr, Type::kInt, "-1",
     "GPU reduce between ranks of one process whose calls meet in a group: from this size the "
     "copy engines move the data in chunks and kernels reduce each chunk locally (-1: 2 MiB "
     "on 2 ranks, never on more; 0: never)"},
    {Use::kTuning, "LOOM_P2P_CE_ALLREDUCE_BYTES", nullptr, Type::kInt, "-1",
     "the same chunked form for all-reduce, from this size (-1: 256 MiB on 2 ranks, never on "
     "more; 0: never)"},
    {Use::kTuning, "LOOM_P2P_CE_CHUNK_BYTES", nullptr, Type::kInt, "0",
     "chunk size of the copy-engine reduce and all-reduce, for measurements (0: a whole slot "
     "for reduce, 64 MiB for all-reduce)"},
    {Use::kTuning, "LOOM_P2P_CE_SCRATCH_BYTES", nullptr, Type::kInt, "268435456",
     "device memory per GPU for the chunks of those forms (per peer: two slots for reduce, four "
     "for all-reduce where each holds 64 MiB), allocated at their first use"},
    {Use::kTuning, "LOOM_P2P_REDUCE_DIRECT_BYTES", nullptr, Type::kInt, "2097152",
     "GPU reduce on 2 ranks: the input straight to the root up to this size, reduce-scatter + "
     "gather above"},
    {Use::kTuning, "LOOM_P2P_LL_BYTES", nullptr, Type::kInt, "-1",
     "GPU all-reduce, reduce and reduce-scatter: the LL one-shot (flags inside the data) while "
     "what a rank sends each peer (the input; a reduce-scatter's part per rank) is at most this "
     "(at most 1 MiB; -1: 1 MiB on 2 ranks, 256 KiB above)"},
    {Use::kTuning, "LOOM_P2P_LL128_BYTES", nullptr, Type::kInt, "0",
     "GPU all-reduce, reduce and reduce-scatter: the LL128 one-shot (120 data bytes and a flag per "
     "128-byte line) above the LL limit while what a rank sends each peer is at most this (at "
     "most 8,601,600 bytes on 2 ranks, 2,211,840 above; 0: never, the default: slower than the "
     "other forms at most sizes on 2 x H200; needs NVLink between the GPUs)"},
    {Use::kUser, "LOOM_NET", "NCCL_NET", Type::kString, "",
     "network backend for GPU buffers between hosts: Socket (the default and, in this build, "
     "the only one)"},
    {Use::kUser, "LOOM_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", Type::kString, "",
     "interfaces for sockets: prefix list, ^ to exclude, = for exact names"},
    {Use::kUser, "LOOM_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY", Type::kString, "",
     "AF_INET or AF_INET6 to force an address family"},
    {Use::kTuning, "LOOM_SOCKET_NTHREADS", "NCCL_SOCKET_NTHREADS", Type::kInt, "1",
     "threads per TCP connection: host buffers 1 unless set; GPU buffers over the network 4 "
     "unless set (the proxy thread moves socket 0, a helper thread each of the others)"},
    {Use::kTuning, "LOOM_NSOCKS_PERTHREAD", "NCCL_NSOCKS_PERTHREAD", Type::kInt, "1",
     "sockets per TCP connection (1 measured best over loopback; more may pay on fast NICs)"},
    {Use::kTuning, "LOOM_BUFFSIZE", "NCCL_BUFFSIZE", Type::kInt, "2097152",
     "bytes of FIFO per connection of host buffers (split into LOOM_STEPS slots)"},
    {Use::kTuning, "LOOM_NET_BUFFSIZE", nullptr, Type::kInt, "8388608",
     "bytes of FIFO per network connection of GPU buffers (page-locked host memory, split into "
     "LOOM_STEPS slots; every rank must use the same)"},
    {Use::kTuning, "LOOM_NET_LANES", nullptr, Type::kInt, "4",
     "GPU buffers over the network: the most lanes (independent parts of one collective other "
     "than all-to-all, each with its own connections and CUDA block) per call, 1 to 8"},
    {Use::kTuning, "LOOM_PROXY_SPIN_US", nullptr, Type::kInt, "5000",
     "microseconds the network proxy thread polls after its last work before it sleeps in 1 ms "
     "steps (a launch wakes it)"},
    {Use::kTuning, "LOOM_STEPS", nullptr, Type::kInt, "8", "slots per connection FIFO"},
    // collectives
    {Use::kTuning, "LOOM_ALGO", "NCCL_ALGO", Type::kString, "",
     "force an algorithm: ring, tree (double binary tree), chain, oneshot; host all-reduce also "
     "doubling (recursive doubling) or direct (up to 4 ranks); on GPUs oneshot or twoshot"},
    {Use::kTuning, "LOOM_PROTO", "NCCL_PROTO", Type::kString, "",
     "force a protocol: simple, ll (GPU all-reduce, reduce and reduce-scatter up to 1 MiB per "
     "peer) or ll128 (up to 8 MiB per peer on 2 ranks, 2 MiB above)"},
    {Use::kTuning, "LOOM_CHUNK_BYTES", nullptr, Type::kInt, "0",
     "pipeline chunk size of host collectives, and the piece size of GPU buffers over the "
     "network (the same on every rank; 0: automatic)"},
    {Use::kTuning, "LOOM_LAUNCH_THREADS", nullptr, Type::kBool, "1",
     "a group that spans several GPU ranks of this process launches each rank's work from its "
     "own thread, all at once (0: one after another in the calling thread)"},
    {Use::kTuning, "LOOM_LAUNCH_SPIN_US", nullptr, Type::kInt, "500",
     "microseconds those launch threads poll for the next group before they sleep"},
    {Use::kTuning, "LOOM_SPIN_US", nullptr, Type::kInt, "-1",
     "microseconds to busy-poll before yielding while waiting on a peer (0: yield at once; "
     "negative: 50 when the communicator's ranks on this host have a CPU each among those "
     "their affinity allows, 0 otherwise)"},
};

struct Cache {
  std::mutex mutex;
  std::map<std::string, std::optional<std::string>> overrides;
  std::map<std::string, std::string> warned;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: used from atexit paths
  return *c;
}

const Definition* find(const char* name) {
  for (const auto& d : kDefinitions) {
    if (std::strcmp(d.name, name) == 0) return &d;
  }
  return nullptr;
}

// Returns the raw text and its source.
std::pair<std::string, std::string> raw(const char* name) {
  const Definition* def = find(name);
  {
    auto& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.overrides.find(name);
    if (it != c.overrides.end() && it->second) return {*it->second, std::string(name)};
  }
  if (const char* v = std::getenv(name); v && *v) return {v, name};
  if (def && def->ncclAlias) {
    if (const char* v = std::getenv(def->ncclAlias); v && *v) return {v, def->ncclAlias};
  }
  return {def ? def->defaultValue : "", "default"};
}

void warnOnce(const std::string& name, const std::string& text) {
  auto& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.warned.count(name)) return;
    c.warned[name] = text;
  }
  LOOM_WARN(kEnv, "%s", text.c_str());
}

}  // namespace

const std::vector<Definition>& all() { return kDefinitions; }

int64_t getInt(const char* name) {
  auto [text, source] = raw(name);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 0);
  if (errno != 0 || end == text.c_str() || *end != '\0') {
    const Definition* def = find(name);
    const char* dflt = def ? def->defaultValue : "0";
    warnOnce(name, std::string(source) + "='" + text + "' is not an integer; using " + dflt);
    return std::strtoll(dflt, nullptr, 0);
  }
  return v;
}

namespace {

// 1 / 0 for the spellings of a yes or a no (any case), -1 for anything else.
int parseBool(std::string text) {
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (text == "1" || text == "true" || text == "yes" || text == "on" || text == "y") return 1;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text == "n") return 0;
  return -1;
}

}  // namespace

bool getBool(const char* name) {
  auto [text, source] = raw(name);
  const int v = parseBool(text);
  if (v >= 0) return v == 1;
  // Not a yes or a no: the default, never a value the user did not ask for.
  const Definition* def = find(name);
  const bool dflt = def && parseBool(def->defaultValue) == 1;
  warnOnce(name, std::string(source) + "='" + text + "' is not a yes or a no (1/0, true/false, "
                 "yes/no, on/off); using the default, " + (dflt ? "1" : "0"));
  return dflt;
}

std::string getString(const char* name) { return raw(name).first; }

std::string sourceOf(const char* name) { return raw(name).second; }

void reloadForTest() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.warned.clear();
}

ScopedSetting::ScopedSetting(const char* name, std::string value) : name_(name) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.overrides.find(name_);
  if (it != c.overrides.end()) previous_ = it->second;
  c.overrides[name_] = std::move(value);
}

ScopedSetting::~ScopedSetting() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (previous_) {
    c.overrides[name_] = *previous_;
  } else {
    c.overrides.erase(name_);
  }
}

}  // namespace loom::settings
