#include "comm/communicator.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "collectives/tuner.h"
#include "common/log.h"
#include "common/process.h"
#include "common/settings.h"

namespace loom::comm {

namespace {

uint64_t fnv(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// Connection set-up messages: one per (sender, receiver) pair and direction.
uint64_t connectTag(int sender, int receiver) {
  return (1ull << 62) | (static_cast<uint64_t>(sender) << 28) | static_cast<uint64_t>(receiver);
}

// A call in execute() or prepare(), counted for ncclCommRevoke (Communicator::quiescent).
class Running {
 public:
  explicit Running(std::atomic<int>* n) : n_(n) { n_->fetch_add(1); }
  ~Running() { n_->fetch_sub(1); }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

 private:
  std::atomic<int>* n_;
};

}  // namespace

uint64_t hostHash() {
  std::string id = settings::get(settings::kHostId);
  if (id.empty()) {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "?");
    id = host;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string b;
    if (boot >> b) {
      id.append(":").append(b);
    } else {
      // The hostname alone: two machines that share one (containers with a copied
      // hostname) would count as one host. Said once; LOOM_HOST_ID settles it.
      static std::once_flag said;
      std::call_once(said, [&] {
        LOOM_WARN(kInit,
                  "cannot read /proc/sys/kernel/random/boot_id: ranks are grouped into hosts by "
                  "hostname (%s) alone; set LOOM_HOST_ID where machines share a hostname",
                  host);
      });
    }
  }
  return fnv(id);
}

Result<std::unique_ptr<Communicator>> Communicator::create(const IdContents& id, int rank,
                                                           int nranks, const CommOptions& options) {
  std::unique_ptr<Communicator> c(new Communicator());
  LOOM_TRY(c->init(id, rank, nranks, options));
  return c;
}

Status Communicator::init(const IdContents& id, int rank, int nranks, const CommOptions& options) {
  options_ = options;
  rank_ = rank;
  nranks_ = nranks;
  timeoutMs_ = settings::get(settings::kTimeoutMs);
  LOOM_ASSIGN_OR_RETURN(forcedAlgo_,
                        collectives::AlgoRequest::parse(settings::get(settings::kAlgo)));
  log::RankScope scope(rank);
  if (rank == 0 && id.fromEnv) {
    IdContents rootId = id;
    Status st = startRoot(&rootId, timeoutMs_);
    if (!st) return st.withContext("rank 0 starting the bootstrap root at LOOM_COMM_ID");
  }
  LOOM_ASSIGN_OR_RETURN(bootstrap_,
                        Bootstrap::join(id, rank, nranks, timeoutMs_, &bootstrapAbort_));
  // Where the ranks are, for the message of a timeout: a port on the bootstrap's interface.
  secret_[0] = id.secret[0];
  secret_[1] = id.secret[1];
  SocketAddress progressAddress;  // travels in PeerInfo (invalid: no port)
  if (auto server = ProgressServer::start(bootstrap_->address(rank), rank, secret_, &progress_)) {
    progressServer_ = std::move(server).value();
    progressAddress = progressServer_->address();
  } else {
    LOOM_INFO(kInit, "rank %d: no progress port (%s): a timeout will not say where this rank was",
              rank, server.status().message().c_str());
  }

  cudaDev_ = options.cudaDev;
  transport::PeerInfo me;
  me.rank = rank;
  me.cudaDev = cudaDev_;
  me.pid = getpid();
  me.process = processToken();
  me.progress = progressAddress;
  struct stat ns {};
  me.pidNs = stat("/proc/self/ns/pid", &ns) == 0 ? static_cast<uint64_t>(ns.st_ino) : 0;
  me.hostHash = hostHash();
  struct stat st {};
  me.shmDevHash = stat("/dev/shm", &st) == 0 ? static_cast<uint64_t>(st.st_dev) : 0;
  gethostname(me.hostName, sizeof(me.hostName) - 1);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int maxCpus = static_cast<int>(sizeof(me.cpuMask) * 8);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) {
    for (int c = 0; c < maxCpus && c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &cpus)) me.cpuMask[c / 64] |= uint64_t{1} << (c % 64);
    }
  } else {  // unknown: every online CPU
    const long online = std::min<long>(sysconf(_SC_NPROCESSORS_ONLN), maxCpus);
    for (long c = 0; c < online; ++c) me.cpuMask[c / 64] |= uint64_t{1} << (c % 64);
  }
  peers_.assign(nranks, transport::PeerInfo{});
  peers_[rank] = me;
  LOOM_TRY(bootstrap_->allGather(peers_.data(), sizeof(transport::PeerInfo)));
  for (int r = 0; r < nranks; ++r) {
    if (peers_[r].rank != r) {
      return errorf(Code::kInternalError, "peer table entry %d holds rank %d", r, peers_[r].rank);
    }
  }
  progressAddresses_.resize(nranks);
  for (int r = 0; r < nranks; ++r) progressAddresses_[r] = peers_[r].progress;

  LOOM_ASSIGN_OR_RETURN(topo_, buildTopologyView(*bootstrap_, peers_, rank_, cudaDev_));
  // The hosts and rails for the hierarchical all-reduce of host buffers (the tuner weighs
  // it where there is one).
  {
    std::vector<uint64_t> hosts(topo_.hostOf.begin(), topo_.hostOf.end());
    collectives::Hierarchy h;
    std::string why;
    if (hosts.size() == static_cast<size_t>(nranks) &&
        collectives::findHierarchy(hosts, rank, &h, &why))
      hier_ = std::move(h);
  }

  context_.self = me;
  int64_t buff = static_cast<int64_t>(
      std::min<uint64_t>(settings::get(settings::kBuffsize).orAuto(0), 1 << 30));
  int64_t steps = std::clamp<int64_t>(settings::get(settings::kSteps), 2, 64);
  if (buff < 4096 * steps) buff = 4096 * steps;
  context_.fifo.slots = static_cast<int>(steps);
  context_.fifo.slotBytes = static_cast<size_t>(buff / steps) / 64 * 64;
  const settings::Amount chunk = settings::get(settings::kChunkBytes);
  if (!chunk.isAuto() && chunk.value > 0 && chunk.value < context_.fifo.slotBytes) {
    context_.fifo.slotBytes = static_cast<size_t>(chunk.value) / 64 * 64 + 64;
  }
  context_.abortFlag = &abortFlag_;
  // Busy-polling only pays when every rank of this host has a core of its own; with
  // more ranks than cores it takes the core the peer needs, so yield at once. 4 ranks on
  // 2 cores, shared memory, 10 interleaved runs (2026-11-30): 8-byte all-reduce median
  // 4.77 us yielding at once against 6.28 spinning 1 us first (Open MPI 5.45); 2 MiB 655
  // against 752 us (Open MPI 1158). The cores are those the host's ranks may run on
  // (their CPU affinity), not all the machine's.
  const settings::Amount spin = settings::get(settings::kSpinUs);
  spinUs_ = spin.isAuto() ? (ranksHaveOwnCpus(peers_, rank_) ? 50 : 0)
                          : static_cast<int64_t>(std::min<uint64_t>(spin.value, 10'000'000));
  launchThreads_ = settings::get(settings::kLaunchThreads);
  context_.commHash = fnv(std::to_string(id.secret[0]) + ":" + std::to_string(id.secret[1]));

  // Transports, in order of preference.
  std::string allowed = settings::get(settings::kTransports);
  auto want = [&](const char* name) {
    if (allowed.empty()) return true;
    return ("," + allowed + ",").find(std::string(",") + name + ",") != std::string::npos;
  };
  // `self` is always there: a rank sending to itself has no other way.
  transports_.push_back(transport::makeSelfTransport(context_));
  if (want("shm")) transports_.push_back(transport::makeShmTransport(context_));
  // Between hosts: the network backend LOOM_NET chooses where that is not sockets (ib),
  // else the tcp transport.
  if (want("net")) {
    auto net = transport::makeNetTransport(context_);
    if (!net) return net.status().withContext("setting up the network transport");
    if (*net) transports_.push_back(std::move(net).value());
  }
  if (want("tcp")) {
    auto tcp = transport::makeTcpTransport(context_);
    if (!tcp) return tcp.status().withContext("setting up the tcp transport");
    transports_.push_back(std::move(tcp).value());
  }
  for (int p = 0; p < nranks; ++p) {
    if (p == rank) continue;
    auto t = selectTransport(p);
    if (t) networkPeers_ = networkPeers_ || transports_[*t]->canConnect(me, peers_[p]).network;
  }
  sends_.resize(nranks);
  recvs_.resize(nranks);
  sendTransport_.assign(nranks, -1);
  recvTransport_.assign(nranks, -1);
  LOOM_INFO(kInit, "comm %s rank %d of %d on %s (pid %d), host memory, FIFO %d x %zu bytes%s%s",
            options_.name.empty() ? "-" : options_.name.c_str(), rank, nranks, me.hostName,
            (int)me.pid, context_.fifo.slots, context_.fifo.slotBytes,
            allowed.empty() ? "" : ", LOOM_TRANSPORTS=", allowed.c_str());
  logTopologyChoices();
  if (cudaDev_ >= 0) {
    collectives::device::ExecutorContext dc;
    dc.abortFlag = &abortFlag_;
    dc.commHash = context_.commHash;
    if (topo_.hostRanks.size() > 1) dc.fabric = fabric(/*hostMemory=*/false);
    auto device =
        collectives::device::DeviceExecutor::create(*bootstrap_, peers_, rank_, cudaDev_, dc);
    if (!device)
      return device.status().withContext("rank " + std::to_string(rank) + " on GPU " +
                                         std::to_string(cudaDev_));
    device_ = std::move(device).value();
  }
  return Status::ok();
}

void Communicator::logTopologyChoices() {
  if (!log::enabled(log::kInfo, log::kInit)) return;
  std::ostringstream ring;
  for (size_t i = 0; i < topo_.ring.size(); ++i) ring << topo_.ring[i] << " -> ";
  if (!topo_.ring.empty()) ring << topo_.ring[0];
  LOOM_INFO(kInit, "ring: %s (from the topology; host ring collectives follow it)",
            ring.str().c_str());
  auto t = collectives::binaryTree(rank_, nranks_);
  LOOM_INFO(kInit, "tree 0: parent %d, children %d %d; tree 1 mirrors it", t.parent, t.children[0],
            t.children[1]);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    auto sel = chooseTransportTo(p);
    if (sel) {
      LOOM_INFO(kInit, "peer %d: would use %s (%s; %s)", p, transports_[sel->index]->name(),
                peers_[p].hostHash == peers_[rank_].hostHash ? "same host" : "another host",
                sel->reason.c_str());
    }
  }
}

Communicator::~Communicator() {
  progressServer_.reset();
  {
    std::lock_guard<std::mutex> lock(workMutex_);
    stopWorker_ = true;
  }
  workCv_.notify_all();
  if (worker_.joinable()) worker_.join();
  device_.reset();
  sends_.clear();
  recvs_.clear();
  transports_.clear();
}

Result<transport::Selection> Communicator::chooseTransportTo(int peer) const {
  std::vector<transport::Offer> offers(transports_.size());
  for (size_t i = 0; i < transports_.size(); ++i)
    offers[i] = {transports_[i]->name(), transports_[i]->canConnect(peers_[rank_], peers_[peer])};
  return transport::chooseTransport(offers, rank_, peer);
}

Result<int> Communicator::selectTransport(int peer) const {
  LOOM_ASSIGN_OR_RETURN(const transport::Selection s, chooseTransportTo(peer));
  return s.index;
}

Status Communicator::ensureConnected(const std::vector<int>& sendPeers,
                                     const std::vector<int>& recvPeers) {
  std::vector<int> needSend, needRecv;
  for (int p : sendPeers)
    if (!sends_[p]) needSend.push_back(p);
  for (int p : recvPeers)
    if (!recvs_[p]) needRecv.push_back(p);
  if (needSend.empty() && needRecv.empty()) return Status::ok();
  Deadline deadline = Deadline::afterMs(timeoutMs_, &abortFlag_);
  // 1. Receivers prepare and tell their senders how to reach them.
  std::vector<std::unique_ptr<transport::RecvSetup>> setups(needRecv.size());
  std::vector<int> setupTransport(needRecv.size());
  for (size_t i = 0; i < needRecv.size(); ++i) {
    int p = needRecv[i];
    LOOM_ASSIGN_OR_RETURN(int t, selectTransport(p));
    auto setup = transports_[t]->listen(peers_[p], deadline);
    if (!setup)
      return setup.status().withContext("preparing the connection from rank " + std::to_string(p));
    setups[i] = std::move(setup).value();
    setupTransport[i] = t;
    ConnectMessage msg{};
    msg.transport = t;
    std::snprintf(msg.name, sizeof(msg.name), "%s", transports_[t]->name());
    msg.blob = setups[i]->blob();
    if (p == rank_) {
      // Talking to ourselves: no message, the sender side picks it up below.
      selfMessage_ = msg;
      continue;
    }
    LOOM_TRY(bootstrap_->send(p, connectTag(p, rank_), &msg, sizeof(msg)));
  }
  // 2. Senders connect.
  for (int p : needSend) {
    ConnectMessage msg{};
    if (p == rank_) {
      msg = selfMessage_;
    } else {
      LOOM_TRY(bootstrap_->recv(p, connectTag(rank_, p), &msg, sizeof(msg)));
    }
    msg.name[sizeof(msg.name) - 1] = 0;
    if (msg.transport < 0 || msg.transport >= static_cast<int>(transports_.size()) ||
        std::strcmp(transports_[msg.transport]->name(), msg.name) != 0) {
      std::string mine;
      for (auto& t : transports_) mine += std::string(mine.empty() ? "" : ", ") + t->name();
      return errorf(Code::kRemoteError,
                    "rank %d chose transport %s (#%d), which rank %d does not have in that place "
                    "(it has %s): LOOM_TRANSPORTS and LOOM_NET must resolve the same on every "
                    "host (an RDMA device on some hosts only? set LOOM_NET=socket)",
                    p, msg.name, msg.transport, rank_, mine.c_str());
    }
    auto conn = transports_[msg.transport]->connect(peers_[p], msg.blob, deadline);
    if (!conn) return conn.status().withContext("connecting to rank " + std::to_string(p));
    {
      std::lock_guard<std::mutex> lock(connMutex_);
      sends_[p] = std::move(conn).value();
    }
    sendTransport_[p] = msg.transport;
    LOOM_INFO(kInit, "connected to rank %d via %s", p, transports_[msg.transport]->name());
  }
  // 3. Receivers take the connections.
  for (size_t i = 0; i < needRecv.size(); ++i) {
    int p = needRecv[i];
    auto conn = setups[i]->accept(deadline);
    if (!conn)
      return conn.status().withContext("accepting the connection from rank " + std::to_string(p));
    {
      std::lock_guard<std::mutex> lock(connMutex_);
      recvs_[p] = std::move(conn).value();
    }
    recvTransport_[p] = setupTransport[i];
  }
  return Status::ok();
}

transport::SendConnection* Communicator::sendConnection(int peer) {
  return peer >= 0 && peer < nranks_ ? sends_[peer].get() : nullptr;
}

transport::RecvConnection* Communicator::recvConnection(int peer) {
  return peer >= 0 && peer < nranks_ ? recvs_[peer].get() : nullptr;
}

std::string Communicator::transportTo(int peer) const {
  if (peer < 0 || peer >= nranks_ || sendTransport_[peer] < 0) return "";
  return transports_[sendTransport_[peer]]->name();
}

Result<int> Communicator::createPreMulSum(const void* scalar, DataType type,
                                          ncclScalarResidence_t residence) {
  std::lock_guard<std::mutex> lock(opsMutex_);
  UserOp u;
  u.live = true;
  u.type = type;
  if (residence == ncclScalarHostImmediate) {
    u.scalar = loadAsDouble(type, scalar, 0);
  } else {
    u.devicePtr = scalar;  // host-memory communicators: read at call time
  }
  for (size_t i = 0; i < userOps_.size(); ++i) {
    if (!userOps_[i].live) {
      userOps_[i] = u;
      return static_cast<int>(ncclNumOps + i);
    }
  }
  userOps_.push_back(u);
  return static_cast<int>(ncclNumOps + userOps_.size() - 1);
}

Status Communicator::destroyRedOp(int op) {
  std::lock_guard<std::mutex> lock(opsMutex_);
  size_t i = static_cast<size_t>(op - ncclNumOps);
  if (op < ncclNumOps || i >= userOps_.size() || !userOps_[i].live) {
    return errorf(Code::kInvalidArgument,
                  "ncclRedOpDestroy: op %d was not created on this "
                  "communicator (or is already destroyed)",
                  op);
  }
  userOps_[i].live = false;
  return Status::ok();
}

Status Communicator::checkOpType(int ncclOp, DataType type) const {
  if (ncclOp < ncclNumOps) return Status::ok();
  std::lock_guard<std::mutex> lock(opsMutex_);
  const size_t i = static_cast<size_t>(ncclOp - ncclNumOps);
  if (i < userOps_.size() && userOps_[i].live && userOps_[i].type != type) {
    return errorf(Code::kInvalidArgument, "PreMulSum op %d was created for %s but used with %s",
                  ncclOp, dataTypeName(userOps_[i].type), dataTypeName(type));
  }
  return Status::ok();
}

bool Communicator::validOp(int ncclOp) const {
  if (ncclOp >= 0 && ncclOp < ncclNumOps) return true;
  std::lock_guard<std::mutex> lock(opsMutex_);
  size_t i = static_cast<size_t>(ncclOp - ncclNumOps);
  return ncclOp >= ncclNumOps && i < userOps_.size() && userOps_[i].live;
}

Result<RedOp> Communicator::resolveOp(int ncclOp, DataType type) const {
  RedOp r;
  switch (ncclOp) {
    case ncclSum: r.kind = RedKind::kSum; return r;
    case ncclProd: r.kind = RedKind::kProd; return r;
    case ncclMax: r.kind = RedKind::kMax; return r;
    case ncclMin: r.kind = RedKind::kMin; return r;
    case ncclAvg:
      if (isFloatType(type)) {
        r.kind = RedKind::kPreMulSum;
        r.scalar = 1.0 / nranks_;
      } else {
        r.kind = RedKind::kSumPostDiv;
        r.divisor = static_cast<uint64_t>(nranks_);
      }
      return r;
    default: break;
  }
  std::lock_guard<std::mutex> lock(opsMutex_);
  size_t i = static_cast<size_t>(ncclOp - ncclNumOps);
  if (ncclOp < ncclNumOps || i >= userOps_.size() || !userOps_[i].live) {
    return errorf(Code::kInvalidArgument, "reduction op %d is not valid on this communicator",
                  ncclOp);
  }
  const UserOp& u = userOps_[i];
  if (u.type != type) {
    return errorf(Code::kInvalidArgument, "PreMulSum op %d was created for %s but used with %s",
                  ncclOp, dataTypeName(u.type), dataTypeName(type));
  }
  r.kind = RedKind::kPreMulSum;
  if (u.devicePtr) {
    LOOM_ASSIGN_OR_RETURN(r.scalar, readScalar(type, u.devicePtr));
  } else {
    r.scalar = u.scalar;
  }
  return r;
}

Result<double> Communicator::readScalar(DataType type, const void* p) const {
  if (!isDeviceBuffer(p)) return loadAsDouble(type, p, 0);
  uint64_t v = 0;
  if (!copyDeviceToHost(&v, p, dataTypeSize(type))) {
    return errorf(Code::kCudaError,
                  "PreMulSum: reading the %s scalar at %p from GPU memory failed "
                  "(freed, or not a device pointer of this process)",
                  dataTypeName(type), p);
  }
  return loadAsDouble(type, &v, 0);
}

ncclResult_t Communicator::asyncError() const {
  // Revoked: in progress until what it stopped has ended, then good again (as a parent).
  if (revoked_.load()) return quiescent() ? ncclSuccess : ncclInProgress;
  if (device_) {
    Status st = device_->kernelError();
    if (!st) {
      const_cast<Communicator*>(this)->setAsyncError(st.code());
      std::lock_guard<std::mutex> lock(failureMutex_);
      if (failure_.empty()) {
        // Found by ncclCommGetAsyncError: said once here, since the caller may only print
        // the error's name.
        failure_ = st.message();
        LOOM_WARN(kColl, "rank %d: %s", rank_, failure_.c_str());
      }
    }
  }
  return static_cast<ncclResult_t>(asyncError_.load());
}

std::string Communicator::lastFailure() const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

Result<void*> Communicator::registerBuffer(void* buff, size_t bytes) {
  if (device_) return device_->registerBuffer(buff, bytes);
  // Host-memory collectives copy through FIFOs either way: accepted, without effect.
  return buff;
}

Status Communicator::deregisterBuffer(void* handle) {
  return device_ ? device_->deregisterBuffer(handle) : Status::ok();
}

bool Communicator::enqueuesOnly(const std::vector<Operation>& ops) const {
  if (!device_ || !device_->mesh()) return false;
  for (const Operation& op : ops) {
    if (!op.onDevice) return false;
  }
  return true;
}

// Operations on device buffers: the GPU mesh, or the network executor.
Status Communicator::runOnDevice(const std::vector<Operation>& ops, size_t* i) {
  const Operation& op = ops[*i];
  if (op.type == collectives::CollType::kSendRecv) {
    size_t j = *i;
    while (j < ops.size() && ops[j].type == collectives::CollType::kSendRecv) ++j;
    size_t begin = *i;
    *i = j;
    return device_->runP2p(ops, begin, j);
  }
  ++*i;
  collectives::device::ExecutorRedOp red;
  bool reduces = op.type == collectives::CollType::kAllReduce ||
                 op.type == collectives::CollType::kReduce ||
                 op.type == collectives::CollType::kReduceScatter;
  if (reduces) {
    if (op.ncclOp >= ncclNumOps) {
      std::lock_guard<std::mutex> lock(opsMutex_);
      size_t k = static_cast<size_t>(op.ncclOp - ncclNumOps);
      if (k < userOps_.size() && userOps_[k].live && userOps_[k].devicePtr &&
          isDeviceBuffer(userOps_[k].devicePtr)) {
        if (userOps_[k].type != op.dtype) {
          return errorf(Code::kInvalidArgument,
                        "PreMulSum op %d was created for %s but used with %s", op.ncclOp,
                        dataTypeName(userOps_[k].type), dataTypeName(op.dtype));
        }
        red.op.kind = RedKind::kPreMulSum;
        red.scalarDevice = userOps_[k].devicePtr;
      }
    }
    if (!red.scalarDevice) {
      LOOM_ASSIGN_OR_RETURN(red.op, resolveOp(op.ncclOp, op.dtype));
    }
  }
  return device_->run(op, red);
}

// A group's Send/Recv calls progress together (a Send, a collective and the matching
// Recv in one group would otherwise wait on each other): all of them run as one batch
// where the first one stands; the other calls keep their order. Returns `groupOps` where
// they are already so, else `ordered`, filled.
namespace {
const std::vector<Operation>& inRunOrder(const std::vector<Operation>& groupOps,
                                         std::vector<Operation>* ordered) {
  size_t firstP2p = groupOps.size(), lastP2p = 0, nP2p = 0;
  for (size_t k = 0; k < groupOps.size(); ++k) {
    if (groupOps[k].type != collectives::CollType::kSendRecv) continue;
    firstP2p = std::min(firstP2p, k);
    lastP2p = k;
    ++nP2p;
  }
  if (nP2p == 0 || lastP2p - firstP2p + 1 == nP2p) return groupOps;
  for (size_t k = 0; k < groupOps.size(); ++k) {
    if (k == firstP2p) {
      for (const Operation& o : groupOps) {
        if (o.type == collectives::CollType::kSendRecv) ordered->push_back(o);
      }
    }
    if (groupOps[k].type != collectives::CollType::kSendRecv) ordered->push_back(groupOps[k]);
  }
  return *ordered;
}
}  // namespace

Status Communicator::prepare(const std::vector<Operation>& groupOps) {
  if (!device_ || device_->mesh()) return Status::ok();
  const Running running(&running_);
  std::vector<Operation> ordered;
  const std::vector<Operation>& ops = inRunOrder(groupOps, &ordered);
  log::RankScope scope(rank_);
  // A communicator aborted, failed, or whose kernels failed: execute says so, as always.
  if (abortFlag_.load() || asyncError_.load() != ncclSuccess || !device_->kernelError().isOk())
    return Status::ok();
  Status st;
  for (size_t i = 0; i < ops.size() && st;) {
    if (!ops[i].onDevice) {
      ++i;
    } else if (ops[i].type == collectives::CollType::kSendRecv) {
      size_t j = i;
      while (j < ops.size() && ops[j].type == collectives::CollType::kSendRecv) ++j;
      st = device_->prepareP2p(ops, i, j);
      i = j;
    } else {
      st = device_->prepare(ops[i++]);
    }
  }
  if (!st) {
    device_->endGroup();
    return failWith(st.withContext("preparing the group's GPU calls"));
  }
  return Status::ok();
}

Status Communicator::execute(const std::vector<Operation>& groupOps) {
  std::vector<Operation> ordered;
  const std::vector<Operation>* opsPtr = &inRunOrder(groupOps, &ordered);
  const std::vector<Operation>& ops = *opsPtr;
  log::RankScope scope(rank_);
  // Counted until the group's end below has run too (revoke waits for both).
  const Running running(&running_);
  // The group's postings are good for this run only.
  struct EndGroup {
    collectives::device::DeviceExecutor* d;
    ~EndGroup() {
      if (d) d->endGroup();
    }
  } endGroup{device_.get()};
  if (revoked_.load()) {
    return errorf(Code::kInvalidUsage,
                  "rank %d: the communicator was revoked (ncclCommRevoke): it is only good for "
                  "ncclCommSplit, ncclCommShrink and ncclCommDestroy",
                  rank_);
  }
  if (abortFlag_.load()) return errorf(Code::kInvalidUsage, "the communicator was aborted");
  if (device_) {
    Status st = device_->kernelError();
    if (!st) {
      // Every later call sees the same kernel error: the ranks are asked the first time.
      if (asyncError_.load() == ncclSuccess) st = explainFailure(st);
      setAsyncError(st.code());
      std::lock_guard<std::mutex> lock(failureMutex_);
      if (failure_.empty()) failure_ = st.message();
      return st;
    }
  }
  if (asyncError_.load() != ncclSuccess) {
    return errorf(static_cast<Code>(asyncError_.load()),
                  "rank %d: the communicator failed earlier (ncclCommGetAsyncError) and can "
                  "only be destroyed or aborted",
                  rank_);
  }
  size_t i = 0;
  while (i < ops.size()) {
    Status st;
    progress_.enter(static_cast<int>(ops[i].type), ops[i].count, ops[i].root,
                    device_ && ops[i].onDevice);
    if (device_ && ops[i].onDevice) {
      st = runOnDevice(ops, &i);
    } else if (ops[i].type == collectives::CollType::kSendRecv) {
      size_t j = i;
      while (j < ops.size() && ops[j].type == collectives::CollType::kSendRecv) ++j;
      st = runP2p(ops, i, j);
      i = j;
    } else {
      st = runCollective(ops[i]);
      ++i;
    }
    if (!st) return failWith(st);
    progress_.leave();
  }
  return Status::ok();
}

Status Communicator::failWith(Status st) {
  st = explainFailure(st);
  setAsyncError(st.code());
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    if (failure_.empty()) failure_ = st.message();
  }
  // Tell every connected peer, so nobody waits on us until its timeout.
  for (auto& s : sends_)
    if (s) s->abort();
  for (auto& r : recvs_)
    if (r) r->abort();
  LOOM_WARN(kColl, "%s", st.message().c_str());
  return st;
}

Status Communicator::explainFailure(Status st) {
  // The others see this rank's failure from now on (before it asks them: two ranks that
  // time out at once then see each other's).
  progress_.setFailure(st.message());
  // Worth asking after a timeout (who never came?) and after a peer's failure (in a
  // cascade, who failed first, and why?); not after this rank's own bad input.
  if (nranks_ < 2 || !(isTimeout(st) || st.code() == Code::kRemoteError)) return st;
  // Up to kAskAll ranks, every one; beyond, those this rank is connected to (every rank
  // asking every other after a failure of thousands would be a storm).
  constexpr int kAskAll = 128;
  std::vector<char> whom(nranks_, nranks_ <= kAskAll ? 1 : 0);
  if (nranks_ > kAskAll) {
    std::lock_guard<std::mutex> lock(connMutex_);
    for (int p = 0; p < nranks_; ++p) whom[p] = sends_[p] != nullptr || recvs_[p] != nullptr;
  }
  ProgressReply mine = progress_.snapshot(rank_);
  mine.failure[0] = '\0';  // say where it was, not that it failed
  const std::string where =
      askWhereRanksAre(progressAddresses_, whom, rank_, secret_, mine, kAnswerMs);
  return Status(st.code(), st.message() + "; " + where);
}

// A loop calls the same collective again and again: the last schedule is kept and
// reused when the call matches it (the ring order never changes).
const collectives::Schedule& Communicator::scheduleFor(const collectives::CollRequest& req,
                                                       collectives::Algorithm algo) {
  ScheduleKey key{req.type, algo, req.count, req.elemSize, req.root, req.pieceElems};
  if (!(haveSchedule_ && key == scheduleKey_)) {
    schedule_ = collectives::buildSchedule(req, algo);
    scheduleKey_ = key;
    haveSchedule_ = true;
  }
  return schedule_;
}

Status Communicator::runCollective(const Operation& op) {
  if (op.count == 0) return runEmptyCall(op);
  collectives::CollRequest req = collectives::requestFor(op, nranks_, rank_);
  const size_t pieceBytes = collectives::hostPieceBytes(op.type, op.count * req.elemSize, nranks_,
                                                        context_.fifo.slotBytes, networkPeers_);
  req.pieceElems = std::max<size_t>(1, pieceBytes / req.elemSize);
  req.ring = &topo_.ring;  // rank order where the topology gave no valid ring
  req.network = networkPeers_;
  // Across hosts the tuner prices ring against tree on this communicator's fabric (hosts,
  // ranks per host, the NICs' speed); inside one host on the flat fabric its rules were
  // measured with.
  if (topo_.hostRanks.size() > 1) req.fabric = &fabric(/*hostMemory=*/true);
  req.hier = hier_ ? &*hier_ : nullptr;
  LOOM_ASSIGN_OR_RETURN(auto choice, collectives::chooseAlgorithm(req, forcedAlgo_));
  const collectives::Schedule& sch = scheduleFor(req, choice.algo);
  collectives::ExecArgs args;
  args.schedule = &sch;
  args.type = op.dtype;
  args.input = op.sendbuff;
  args.output = op.recvbuff;
  args.rank = rank_;
  args.pieceBytes = req.pieceElems * req.elemSize;
  args.timeoutMs = timeoutMs_;
  args.spinUs = spinUs_;
  args.abortFlag = &abortFlag_;
  if (sch.reduces) {
    LOOM_ASSIGN_OR_RETURN(args.op, resolveOp(op.ncclOp, op.dtype));
  }
  args.coll = op.type;
  args.algo = choice.algo;
  args.count = op.count;
  LOOM_INFO(kColl, "%s: %s", collectives::describe(args).c_str(), choice.text().c_str());
  if (choice.algo == collectives::Algorithm::kOneShot) return runOneShotAllReduce(op, sch, args);
  // In-place all-to-all reads blocks that it also overwrites: work from a copy.
  std::vector<char> copy;
  if (op.type == collectives::CollType::kAllToAll && op.sendbuff == op.recvbuff && op.count > 0) {
    size_t bytes = op.count * nranks_ * req.elemSize;
    copy.assign(static_cast<const char*>(op.sendbuff),
                static_cast<const char*>(op.sendbuff) + bytes);
    args.input = copy.data();
  }
  return collectives::runSchedule(args, *this);
}

Status Communicator::runEmptyCall(const Operation& op) {
  if (nranks_ < 2) return Status::ok();
  const collectives::Schedule sch = collectives::emptyCall(rank_, nranks_, &topo_.ring);
  collectives::ExecArgs args;
  args.schedule = &sch;
  args.type = op.dtype;
  args.rank = rank_;
  args.pieceBytes = context_.fifo.slotBytes;
  args.timeoutMs = timeoutMs_;
  args.spinUs = spinUs_;
  args.abortFlag = &abortFlag_;
  args.coll = op.type;
  args.algo = collectives::Algorithm::kRing;
  args.count = 0;
  return collectives::runSchedule(args, *this);
}

Status Communicator::runOneShotAllReduce(const Operation& op, const collectives::Schedule& sch,
                                         collectives::ExecArgs args) {
  // Gather every rank's input, then reduce the blocks in rank order: every rank does the
  // same arithmetic in the same order, so results are bitwise equal everywhere.
  const size_t es = dataTypeSize(op.dtype);
  const size_t bytes = op.count * es;
  // The pre-op (PreMulSum's scalar) belongs to the rank that owns the input, so it is
  // applied before sending.
  scratch_.resize(bytes * (nranks_ + 1));
  args.output = scratch_.data();
  LOOM_ASSIGN_OR_RETURN(RedOp red, resolveOp(op.ncclOp, op.dtype));
  args.op = red;
  if (hasPreOp(red) && op.count > 0) {
    char* pre = scratch_.data() + bytes * nranks_;
    applyPreOp(op.dtype, red, pre, op.sendbuff, op.count);
    args.input = pre;
  }
  LOOM_TRY(collectives::runSchedule(args, *this));
  char* out = static_cast<char*>(op.recvbuff);
  const char* block = scratch_.data();
  if (op.count > 0) std::memcpy(out, block, bytes);
  for (int q = 1; q < nranks_; ++q) {
    reduce(op.dtype, red, out, out, block + q * bytes, op.count);
  }
  if (hasPostOp(red)) applyPostOp(op.dtype, red, out, out, op.count);
  return Status::ok();
}

Status Communicator::runP2p(const std::vector<Operation>& ops, size_t begin, size_t end) {
  // A send whose bytes a receive of the group overwrites (in place) leaves from a copy:
  // the steps progress together, and a receive may land before its send has read them.
  std::vector<std::vector<char>> copies;
  std::vector<const void*> from(end - begin);
  for (size_t i = begin; i < end; ++i) from[i - begin] = ops[i].sendbuff;
  for (size_t i : collectives::sendsOverwrittenByReceives(ops, begin, end)) {
    const char* p = static_cast<const char*>(ops[i].sendbuff);
    copies.emplace_back(p, p + ops[i].count * dataTypeSize(ops[i].dtype));
    from[i - begin] = copies.back().data();
  }
  // Byte-wise steps, each on its own buffer: one phase progressing all of them.
  collectives::Schedule sch;
  sch.reduces = false;
  collectives::Phase phase;
  std::vector<const void*> bases;
  for (size_t i = begin; i < end; ++i) {
    const Operation& op = ops[i];
    collectives::Step st;
    st.count = op.count * dataTypeSize(op.dtype);
    if (op.isSend) {
      st.src = {collectives::Buffer::kAbsolute, 0};
      st.sendTo(op.root);
    } else {
      st.dst = {collectives::Buffer::kAbsolute, 0};
      st.recvFrom(op.root);
    }
    phase.push_back(st);
  }
  // Each step has its own buffer: its region holds the address itself.
  for (size_t i = 0; i < phase.size(); ++i) {
    const Operation& op = ops[begin + i];
    uintptr_t addr =
        op.isSend ? reinterpret_cast<uintptr_t>(from[i]) : reinterpret_cast<uintptr_t>(op.recvbuff);
    if (op.isSend)
      phase[i].src.offset = addr;
    else
      phase[i].dst.offset = addr;
  }
  sch.phases.push_back(std::move(phase));
  collectives::ExecArgs args;
  args.schedule = &sch;
  args.type = DataType::kUint8;
  args.input = nullptr;
  args.output = nullptr;
  args.rank = rank_;
  args.pieceBytes = context_.fifo.slotBytes;
  args.timeoutMs = timeoutMs_;
  args.spinUs = spinUs_;
  args.abortFlag = &abortFlag_;
  args.what = "Send/Recv group (" + std::to_string(end - begin) + " calls)";
  return collectives::runSchedule(args, *this);
}

void Communicator::setAsyncError(Code code) {
  int expected = ncclSuccess;
  asyncError_.compare_exchange_strong(expected, static_cast<int>(code));
}

void Communicator::abort() {
  bootstrapAbort_.store(true);
  stopOperations();
}

bool Communicator::revoke(int64_t ms) {
  // The bootstrap is stopped too while calls stopped here may still wait on it (a
  // connection's set-up); it runs again once they have ended (readyAsParent).
  bootstrapAbort_.store(true);
  revoked_.store(true);
  stopOperations();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!quiescent()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return readyAsParent("ncclCommRevoke").isOk();
}

bool Communicator::quiescent() const {
  return revoked_.load() && running_.load() == 0 && (!device_ || device_->idle());
}

Status Communicator::readyAsParent(const char* fn) {
  if (!revoked_.load()) return Status::ok();
  if (!quiescent()) {
    return errorf(Code::kInvalidUsage,
                  "%s: rank %d: the communicator was revoked and what it stopped has not ended "
                  "yet (ncclCommGetAsyncError says ncclInProgress until it has)",
                  fn, rank_);
  }
  bootstrapAbort_.store(false);
  return Status::ok();
}

void Communicator::stopOperations() {
  abortFlag_.store(true);
  if (device_) device_->abort();
  // Another thread may be connecting (ensureConnected) while we look at the connections.
  std::lock_guard<std::mutex> lock(connMutex_);
  for (auto& s : sends_)
    if (s) s->abort();
  for (auto& r : recvs_)
    if (r) r->abort();
}

void Communicator::leave() {
  // Under the lock: waitIdle may free this object as soon as it sees zero, so the count
  // must not reach zero before this thread is done with the mutex and the condition.
  std::lock_guard<std::mutex> lock(idleMutex_);
  if (busy_.fetch_sub(1) == 1) idleCv_.notify_all();
}

bool Communicator::waitIdle(int64_t ms) {
  std::unique_lock<std::mutex> lock(idleMutex_);
  return idleCv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return busy_.load() == 0; });
}

void Communicator::executeAsync(std::vector<Operation> ops, std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lock(workMutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { workerMain(); });
    work_.push_back([this, ops = std::move(ops), done = std::move(done)] { done(execute(ops)); });
  }
  workCv_.notify_one();
}

SpinWorker& Communicator::launcher() {
  std::lock_guard<std::mutex> lock(workMutex_);
  if (!launcher_) {
    launcher_ =
        std::make_unique<SpinWorker>(std::max<int64_t>(0, settings::get(settings::kLaunchSpinUs)));
  }
  return *launcher_;
}

void Communicator::workerMain() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(workMutex_);
      workCv_.wait(lock, [&] { return stopWorker_ || !work_.empty(); });
      if (work_.empty()) return;
      job = std::move(work_.front());
      work_.pop_front();
    }
    job();
  }
}

}  // namespace loom::comm
