// The host side of one small network step on the GPU path: a proxy (transports/net/proxy.h)
// with a connection to itself over the socket backend, and this thread standing in for
// both kernels. It posts 8 bytes into the send FIFO and spins until the receive FIFO says
// they arrived: the proxy notices the post, sends, receives, and publishes the slot. No
// GPU: what a kernel's own flag writes and reads over PCIe cost is not in it.
//
//   net_step_probe [STEPS [IDLE [BYTES [DEPTH]]]]
//       STEPS steps (default 20000); IDLE further connections that the proxy polls but
//       that carry nothing (default 0). BYTES above 8: the stream instead, as a large
//       transfer takes the FIFO: every step a full slot of BYTES, as many in flight as
//       the FIFO's 8 slots allow (DEPTH: at most that many), and the bytes per second of
//       the whole run (the slots' bytes are written once, so the figure is the proxy's and
//       the backend's alone), and the CPU time the proxy and the backend's threads took for
//       it, in nanoseconds a byte; with DEPTH 1, the mean time of one step is its latency.
//
// Threads per connection as loom takes them (LOOM_SOCKET_NTHREADS, default 4); with
// LOOM_NET=ucx, UCX's UCP instead (LOOM_UCX_LANES lanes, 2 where unset, as GPU buffers take).
// Prints the mean, median, 90th and 99th percentiles of the step in microseconds.
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "transports/net/connect.h"
#include "transports/net/net_fifo.h"
#include "transports/net/proxy.h"
#include "transports/net/ucx/ucx.h"

namespace {

using namespace loom;
using namespace loom::transport::net;

struct FifoMemory {
  explicit FifoMemory(uint32_t slots = 8, uint64_t slotBytes = 64 * 1024) {
    const size_t bytes = fifoBytes(slots, slotBytes);
    p = std::aligned_alloc(4096, bytes);
    std::memset(p, 0, bytes);
    fifo = fifoAt(p, slots, slotBytes, 0);
  }
  ~FifoMemory() { std::free(p); }
  void* p = nullptr;
  Fifo fifo;
};

// A connection from this rank to itself: nothing to exchange.
Result<Connections> selfConnection(Backend& b) {
  HandleExchange ex;
  ex.send = [](int, const Handle&) { return Status::ok(); };
  ex.tryRecv = [](int, Handle*) -> Result<bool> { return false; };
  Connections c;
  LOOM_TRY(connectPeers(b, 0, 0, {0}, {0}, ex, Deadline::afterMs(10000), &c));
  return c;
}

uint64_t loadAcquire(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}
void storeRelease(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}

// Posts message `seq` of `bytes` whose bytes are at `data` as the kernel does: as tagged
// words where it is small, else in the slot (then its head, with release).
void post(const Fifo& f, uint64_t seq, const char* data, uint64_t bytes) {
  if (f.isSmall(bytes)) {
    for (uint32_t w = 0; w < fifoWords(bytes); ++w) {
      uint32_t payload = 0;
      std::memcpy(&payload, data + 4 * w, std::min<uint64_t>(4, bytes - 4 * w));
      std::atomic_ref<uint64_t>(f.header->ll[seq % f.nslots][w])
          .store(fifoWord(seq, payload), std::memory_order_relaxed);
    }
    std::atomic_ref<uint64_t>(f.header->head[seq % f.nslots])
        .store(fifoHead(seq, bytes), std::memory_order_relaxed);
  } else {
    if (data != f.slot(seq)) std::memcpy(f.slot(seq), data, bytes);
    storeRelease(&f.header->head[seq % f.nslots], fifoHead(seq, bytes));
  }
}
// Whether message `seq` of `bytes` has arrived, as the kernel sees it (a small one: its
// tagged words); its bytes then go to `out` (bytes of it).
bool arrived(const Fifo& f, uint64_t seq, uint64_t bytes, char* out) {
  if (f.isSmall(bytes)) {
    for (uint32_t w = 0; w < fifoWords(bytes); ++w) {
      const uint64_t word = loadAcquire(&f.header->ll[seq % f.nslots][w]);
      if (!fifoHeadIs(word, seq)) return false;
      const uint32_t payload = static_cast<uint32_t>(word);
      std::memcpy(out + 4 * w, &payload, std::min<uint64_t>(4, bytes - 4 * w));
    }
    return fifoHeadSize(loadAcquire(&f.header->head[seq % f.nslots])) == bytes;
  }
  const uint64_t head = loadAcquire(&f.header->head[seq % f.nslots]);
  if (!fifoHeadIs(head, seq)) return false;
  if (fifoHeadSize(head) == bytes) std::memcpy(out, f.slot(seq), bytes);
  return true;
}

// The stream: the send FIFO kept full of BYTES-sized steps, the receive FIFO drained; each
// step's first and last 8 bytes carry its number (the rest is a pattern written once).
// Returns the run's seconds, or a negative number after saying what went wrong.
double stream(Proxy& proxy, const Fifo& send, const Fifo& recv, int steps, uint64_t bytes,
              uint32_t depth) {
  for (uint32_t k = 0; k < send.nslots; ++k) {
    for (uint64_t b = 0; b < bytes; ++b) send.slot(k)[b] = static_cast<char>(0x5a ^ (b * 7));
  }
  uint64_t posted = 0, received = 0;
  std::vector<char> data(bytes), got(bytes);
  for (uint64_t b = 0; b < bytes; ++b) data[b] = static_cast<char>(0x5a ^ (b * 7));
  const auto start = Clock::now();
  while (received < uint64_t(steps)) {
    bool idle = true;
    while (posted < uint64_t(steps) && posted - received < depth &&
           posted - loadAcquire(&send.header->done) < send.nslots) {
      const uint64_t stamp = 0x1000 + posted;
      char* at = send.isSmall(bytes) ? data.data() : send.slot(posted);
      std::memcpy(at, &stamp, sizeof(stamp));
      std::memcpy(at + bytes - sizeof(stamp), &stamp, sizeof(stamp));
      post(send, posted, at, bytes);
      ++posted;
      idle = false;
    }
    while (received < posted && arrived(recv, received, bytes, got.data())) {
      uint64_t head = 0, tail = 0;
      std::memcpy(&head, got.data(), sizeof(head));
      std::memcpy(&tail, got.data() + bytes - sizeof(tail), sizeof(tail));
      if (head != 0x1000 + received || tail != head) {
        std::fprintf(stderr, "net_step_probe: step %llu arrived wrong\n",
                     (unsigned long long)received);
        return -1;
      }
      storeRelease(&recv.header->done, ++received);
      idle = false;
    }
    if (idle) {
      if (Status st = proxy.firstError(); !st) {
        std::fprintf(stderr, "net_step_probe: %s\n", st.message().c_str());
        return -1;
      }
      std::this_thread::yield();  // the proxy and the backend's threads need the cores
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20000;
  const int idle = argc > 2 ? std::max(0, std::atoi(argv[2])) : 0;
  const uint64_t bytes = argc > 3 ? std::max<long long>(8, std::atoll(argv[3])) : 8;
  const uint32_t depth = argc > 4 ? uint32_t(std::clamp(std::atoi(argv[4]), 1, 8)) : 8;
  Context ctx;
  ctx.commHash = 1;
  const char* net = std::getenv("LOOM_NET");
  const bool ucx = net && strcasecmp(net, "ucx") == 0;
  const char* threadsVar = ucx ? "LOOM_UCX_LANES" : "LOOM_SOCKET_NTHREADS";
  const char* threads = std::getenv(threadsVar);
  auto backend = ucx ? ucx::makeUcxBackend(ctx) : makeSocketBackend(ctx);
  if (!backend.isOk()) {
    std::fprintf(stderr, "net_step_probe: %s\n", backend.status().message().c_str());
    return 1;
  }
  std::vector<Connections> conns;
  for (int k = 0; k <= idle; ++k) {
    auto c = selfConnection(**backend);
    if (!c.isOk()) {
      std::fprintf(stderr, "net_step_probe: connecting: %s\n", c.status().message().c_str());
      return 1;
    }
    conns.push_back(std::move(c).value());
  }
  std::vector<std::unique_ptr<FifoMemory>> fifos;
  for (int k = 0; k < 2 * (idle + 1); ++k) {
    fifos.push_back(std::make_unique<FifoMemory>(8, std::max<uint64_t>(bytes, 64 * 1024)));
  }
  std::vector<double> us;
  us.reserve(steps);
  double seconds = 0, proxyCpu = 0;  // the stream's
  {
    Proxy proxy(0, 5000);
    for (int k = 0; k <= idle; ++k) {
      proxy.addSend(std::move(conns[k].sends[0]), fifos[2 * k]->fifo);
      proxy.addRecv(std::move(conns[k].recvs[0]), fifos[2 * k + 1]->fifo);
    }
    const Fifo& send = fifos[0]->fifo;
    const Fifo& recv = fifos[1]->fifo;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (bytes > 8) {
      const double before = proxy.cpuSeconds();  // (it polled while the connections settled)
      seconds = stream(proxy, send, recv, steps, bytes, depth);
      if (seconds < 0) return 1;
      proxyCpu = proxy.cpuSeconds() - before;
    }
    for (int i = 0; bytes == 8 && i < steps; ++i) {
      const uint64_t value = 0x1000 + uint64_t(i);
      uint64_t got = 0;
      const auto start = Clock::now();
      post(send, i, reinterpret_cast<const char*>(&value), sizeof(value));
      while (!arrived(recv, i, sizeof(got), reinterpret_cast<char*>(&got))) {
        if (Status st = proxy.firstError(); !st) {
          std::fprintf(stderr, "net_step_probe: %s\n", st.message().c_str());
          return 1;
        }
        cpuRelax();
      }
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      if (got != value) {
        std::fprintf(stderr, "net_step_probe: step %d carried %llu, not %llu\n", i,
                     (unsigned long long)got, (unsigned long long)value);
        return 1;
      }
      storeRelease(&recv.header->done, uint64_t(i) + 1);
    }
  }
  if (bytes > 8) {
    // The proxy has ended, and with it the connections: every backend thread has counted
    // its CPU time (the ucx send connections' flushes are waited for).
    const double helpers = (*backend)->threadCpuSeconds();
    const double moved = double(bytes) * steps;
    std::printf(
        "net_step_probe: %s, %d steps of %llu B, at most %u in flight, in %.3f s: %.2f GB/s, "
        "%.1f us a step (threads/lanes %s); CPU: the proxy %.3f s, the backend's threads "
        "%.3f s, %.2f ns a byte\n",
        ucx ? "ucx" : "socket", steps, (unsigned long long)bytes, depth, seconds,
        moved / seconds / 1e9, seconds * 1e6 / steps, threads ? threads : "(default)", proxyCpu,
        helpers, (proxyCpu + helpers) * 1e9 / moved);
    return 0;
  }
  double sum = 0;
  for (double v : us) sum += v;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
  std::printf(
      "net_step_probe: %s, %d steps of 8 B, %d idle connection(s), %s=%s: "
      "mean %.2f us, median %.2f, p90 %.2f, p99 %.2f\n",
      ucx ? "ucx" : "socket", steps, idle, threadsVar, threads ? threads : "(default)",
      sum / double(us.size()), at(0.5), at(0.9), at(0.99));
  return 0;
}
