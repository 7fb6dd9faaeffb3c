// The ib backend's per-message host cost: one connection over the emulated RDMA devices
// (LOOM_IB_EMULATE=roce; the emulation's NIC threads stand for the hardware), messages of
// 8 B to 1 MiB with kMaxRequests in flight, sender and receiver driven from this thread.
// Reports messages per second; `host_ns_per_msg`, the time per message spent in the calls
// that did its work (the irecv and isend that posted it, and the test on each end that
// found it done: what the proxy pays per message on hardware); and `thread_ns_per_msg`,
// all of this thread's CPU per message, polling for the emulated NIC included (the
// emulation's NIC threads are in neither). Goal: host_ns_per_msg under 1 us.
#include <benchmark/benchmark.h>
#include <time.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/settings.h"
#include "transports/net/ib/ib.h"
#include "transports/net/net.h"

namespace net = loom::transport::net;
using loom::Clock;

namespace {

double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
  int64_t workNs = 0;
  auto timed = [&](auto call) {
    const auto t0 = Clock::now();
    const bool did = call();
    if (did)
      workNs += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
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
  state.counters["thread_ns_per_msg"] = total ? cpu * 1e9 / total : 0;
  (void)c.send->deregMr(*smh);
  (void)c.recv->deregMr(*rmh);
}

}  // namespace

BENCHMARK(BM_IbMessages)->Arg(8)->Arg(4096)->Arg(65536)->Arg(1 << 20)->UseRealTime();
BENCHMARK_MAIN();
