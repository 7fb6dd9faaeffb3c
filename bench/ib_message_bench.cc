// The ib backend's per-message host cost: one connection over the emulated RDMA devices
// (LOOM_IB_EMULATE=roce; the emulation's NIC threads stand for the hardware), messages of
// 8 B to 1 MiB with kMaxRequests in flight, sender and receiver driven from this thread.
// Reports messages per second; `host_ns_per_msg`, the time per message spent in the calls
// that did its work (the irecv and isend that posted it, and the test on each end that
// found it done: what the proxy pays per message on hardware); and `thread_ns_per_msg`,
// all of this thread's CPU per message, polling for the emulated NIC included (the
// emulation's NIC threads are in neither). Goal: host_ns_per_msg under 1 us.
//
// The emulated verbs calls cost far more than a NIC's (a mutex shared with the emulation's
// NIC threads and an eventfd write per post, against a doorbell write or a read of the
// completion queue), so the benchmark also times them: the fast-path entries of the verbs
// table (post_send, post_recv, poll_cq) go through wrappers that add their time up.
// `verbs_ns_per_msg` is their share of host_ns_per_msg, and `backend_ns_per_msg` the rest:
// what the backend itself costs per message (the wrappers' clock reads, two per verbs
// call, count as the verbs'); `verbs_calls_per_msg` counts the fast-path calls in them.
#include <benchmark/benchmark.h>
#include <time.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/settings.h"
#include "transports/net/ib/ib.h"
#include "transports/net/ib/verbs.h"
#include "transports/net/net.h"

namespace net = loom::transport::net;
using loom::Clock;

namespace {

double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The emulated table, with its fast-path calls timed (only this thread makes them).
namespace ib = loom::transport::net::ib;
const ib::Verbs* gInner = nullptr;
int64_t gVerbsNs = 0;
int64_t gVerbsCalls = 0;
int64_t gKindCalls[3] = {};  // post_send, post_recv, poll_cq

template <typename F>
auto timedVerb(F call) {
  const auto t0 = Clock::now();
  auto r = call();
  gVerbsNs += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  ++gVerbsCalls;
  return r;
}
int timedPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  ++gKindCalls[0];
  return timedVerb([&] { return gInner->postSend(qp, wr, bad); });
}
int timedPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  ++gKindCalls[1];
  return timedVerb([&] { return gInner->postRecv(qp, wr, bad); });
}
int timedPollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  ++gKindCalls[2];
  return timedVerb([&] { return gInner->pollCq(cq, n, wc); });
}

// Puts the timed table in place of the emulated one for the scope.
class TimedVerbs {
 public:
  TimedVerbs() {
    auto v = ib::activeVerbs();
    if (!v) return;
    gInner = v.value();
    table_ = *gInner;
    table_.postSend = timedPostSend;
    table_.postRecv = timedPostRecv;
    table_.pollCq = timedPollCq;
    ib::setVerbsForTesting(&table_);
    ok_ = true;
  }
  ~TimedVerbs() { ib::setVerbsForTesting(nullptr); }
  bool ok() const { return ok_; }

 private:
  ib::Verbs table_;
  bool ok_ = false;
};

struct Conn {
  std::unique_ptr<net::Backend> backend;
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
};

bool connect(Conn* c) {
  net::Context ctx;
  ctx.commHash = 1;
  ctx.rank = 0;
  auto b = net::ib::makeIbBackend(ctx);
  if (!b) return false;
  c->backend = std::move(b).value();
  net::Handle h;
  std::unique_ptr<net::ListenComm> l;
  if (!c->backend->listen(0, &h, &l)) return false;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((!c->send || !c->recv) && Clock::now() < deadline) {
    if (!c->send && !c->backend->connect(0, &h, 0, &c->send)) return false;
    if (!c->recv && !l->accept(&c->recv)) return false;
  }
  return c->send && c->recv;
}

void BM_IbMessages(benchmark::State& state) {
  loom::settings::ScopedSetting emu(loom::settings::kIbEmulate, "roce");
  TimedVerbs timedVerbs;
  if (!timedVerbs.ok()) {
    state.SkipWithError("the emulated verbs table is not there");
    return;
  }
  Conn c;
  if (!connect(&c)) {
    state.SkipWithError("no connection over the emulated devices");
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int depth = net::kMaxRequests;
  std::vector<char> out(bytes * depth, 7), in(bytes * depth);
  auto smh = c.send->regMr(out.data(), out.size(), net::MemType::kHost);
  auto rmh = c.recv->regMr(in.data(), in.size(), net::MemType::kHost);
  if (!smh || !rmh) {
    state.SkipWithError("registration failed");
    return;
  }
  std::vector<net::Request*> sreq(depth), rreq(depth);
  uint64_t sent = 0, sdone = 0, recvd = 0, rdone = 0, total = 0;
  const double cpu0 = threadCpuSeconds();
  int64_t workNs = 0, workVerbsNs = 0, workVerbsCalls = 0, workKind[3] = {};
  auto timed = [&](auto call) {
    const int64_t verbs0 = gVerbsNs, calls0 = gVerbsCalls;
    const int64_t kind0[3] = {gKindCalls[0], gKindCalls[1], gKindCalls[2]};
    const auto t0 = Clock::now();
    const bool did = call();
    if (did) {
      workNs += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      workVerbsNs += gVerbsNs - verbs0;
      workVerbsCalls += gVerbsCalls - calls0;
      for (int k = 0; k < 3; ++k) workKind[k] += gKindCalls[k] - kind0[k];
    }
    return did;
  };
  for (auto _ : state) {
    // One message per iteration, the window kept full.
    const uint64_t target = ++total;
    while (rdone < target) {
      while (recvd - rdone < uint64_t(depth)) {
        void* d = in.data() + (recvd % depth) * bytes;
        size_t cap = bytes;
        int tag = 0;
        net::MemHandle mh = *rmh;
        if (!timed([&] {
              return c.recv->irecv(1, &d, &cap, &tag, &mh, &rreq[recvd % depth]).isOk() &&
                     rreq[recvd % depth];
            }))
          break;
        ++recvd;
      }
      while (sent < recvd && sent - sdone < uint64_t(depth)) {
        if (!timed([&] {
              return c.send
                         ->isend(out.data() + (sent % depth) * bytes, bytes, 0, *smh,
                                 &sreq[sent % depth])
                         .isOk() &&
                     sreq[sent % depth];
            }))
          break;
        ++sent;
      }
      bool done = false;
      size_t size = 0;
      if (sdone < sent &&
          timed([&] { return c.send->test(sreq[sdone % depth], &done, &size).isOk() && done; }))
        ++sdone;
      done = false;
      loom::Status st;
      if (rdone < recvd && timed([&] {
            st = c.recv->test(rreq[rdone % depth], &done, &size);
            return st.isOk() && done;
          }))
        ++rdone;
      if (!st) {
        state.SkipWithError(st.message().c_str());
        return;
      }
    }
  }
  const double cpu = threadCpuSeconds() - cpu0;
  state.SetItemsProcessed(static_cast<int64_t>(total));
  state.SetBytesProcessed(static_cast<int64_t>(total * bytes));
  state.counters["host_ns_per_msg"] = total ? double(workNs) / total : 0;
  state.counters["verbs_ns_per_msg"] = total ? double(workVerbsNs) / total : 0;
  state.counters["backend_ns_per_msg"] = total ? double(workNs - workVerbsNs) / total : 0;
  state.counters["verbs_calls_per_msg"] = total ? double(workVerbsCalls) / total : 0;
  state.counters["post_send_per_msg"] = total ? double(workKind[0]) / total : 0;
  state.counters["post_recv_per_msg"] = total ? double(workKind[1]) / total : 0;
  state.counters["poll_cq_per_msg"] = total ? double(workKind[2]) / total : 0;
  state.counters["thread_ns_per_msg"] = total ? cpu * 1e9 / total : 0;
  (void)c.send->deregMr(*smh);
  (void)c.recv->deregMr(*rmh);
}

}  // namespace

BENCHMARK(BM_IbMessages)->Arg(8)->Arg(4096)->Arg(65536)->Arg(1 << 20)->UseRealTime();
BENCHMARK_MAIN();
