// The RDMA emulation (transports/net/ib/emulator.h), used through its verbs table only, as
// the ib backend uses it: devices, ports and GIDs, the queue-pair state machine, and RC
// semantics between two QPs of one process and of two processes (fork): writes land
// exactly, immediates consume receives, completions keep posting order, errors complete
// and flush as on hardware, and a peer that dies ends in "transport retry counter exceeded".
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transports/net/ib/emulator.h"
#include "transports/net/ib/ib_select.h"

namespace loom::transport::net::ib {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// What one side tells the other so that it can connect and write.
struct Address {
  uint32_t qpn = 0;
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint64_t addr = 0;  // its registered buffer
  uint64_t length = 0;
  uint32_t rkey = 0;
};

struct Options {
  uint8_t timeout = 14;  // 67 ms
  uint8_t retryCnt = 7;
  uint8_t rnrRetry = 7;     // for ever
  uint8_t minRnrTimer = 1;  // 10 us: this side's delay for RNR NAKs it sends
  uint32_t sendWr = 512;
  uint32_t recvWr = 512;
  int cqe = 4096;
  bool sigAll = false;
  size_t bytes = size_t{1} << 20;
};

void fillPattern(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<uint8_t>(x);
  }
}

// One side: a context, protection domain, CQ, a QP brought to INIT and a registered
// buffer. `error` says what failed first (empty: all well).
class Endpoint {
 public:
  Endpoint(const Verbs* v, int device, Options o = {}) : v(v), o(o) { open(device); }
  ~Endpoint() {
    if (qp) v->destroyQp(qp);
    if (mr) v->deregMr(mr);
    if (cq) v->destroyCq(cq);
    if (pd) v->deallocPd(pd);
    if (ctx) v->closeDevice(ctx);
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  bool ok() const { return error.empty(); }

  Address address() const {
    Address a;
    a.qpn = qp->qp_num;
    a.lid = lid;
    std::memcpy(a.gid, gid.raw, 16);
    a.addr = reinterpret_cast<uintptr_t>(buf.data());
    a.length = buf.size();
    a.rkey = mr->rkey;
    return a;
  }

  // INIT -> RTR -> RTS towards `peer`; an error number.
  int connect(const Address& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer.qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = o.minRnrTimer;
    a.ah_attr.port_num = 1;
    if (infiniband) {
      a.ah_attr.dlid = peer.lid;
    } else {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex);
      a.ah_attr.grh.hop_limit = 255;
    }
    if (int e = v->modifyQp(qp, &a, kRtrMask)) return e;
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = o.timeout;
    s.retry_cnt = o.retryCnt;
    s.rnr_retry = o.rnrRetry;
    s.max_rd_atomic = 1;
    return v->modifyQp(qp, &s, kRtsMask);
  }

  // An RDMA write of buf[offset, offset + len) to the peer's buffer at remoteOffset.
  int write(uint64_t wrId, size_t offset, size_t len, const Address& peer, size_t remoteOffset,
            std::optional<uint32_t> imm = std::nullopt, unsigned flags = IBV_SEND_SIGNALED,
            uint32_t rkey = 0, uint32_t lkey = 0) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(buf.data()) + offset;
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = lkey ? lkey : mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = wrId;
    wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = flags;
    if (imm) wr.imm_data = htonl(*imm);
    wr.wr.rdma.remote_addr = peer.addr + remoteOffset;
    wr.wr.rdma.rkey = rkey ? rkey : peer.rkey;
    if (len > 0) {
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    ibv_send_wr* bad = nullptr;
    return v->postSend(qp, &wr, &bad);
  }

  // A receive; with len > 0, into buf[offset, offset + len).
  int postRecv(uint64_t wrId, size_t offset = 0, size_t len = 0) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(buf.data()) + offset;
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = mr->lkey;
    ibv_recv_wr wr{};
    wr.wr_id = wrId;
    if (len > 0) {
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    ibv_recv_wr* bad = nullptr;
    return v->postRecv(qp, &wr, &bad);
  }

  // Up to n completions, waiting at most `limit` for them.
  std::vector<ibv_wc> wait(size_t n, std::chrono::milliseconds limit = 3000ms) {
    std::vector<ibv_wc> out;
    const auto deadline = Clock::now() + limit;
    ibv_wc wc[16];
    while (out.size() < n && Clock::now() < deadline) {
      const int got = v->pollCq(cq, 16, wc);
      if (got < 0) {
        error = "poll failed";
        break;
      }
      out.insert(out.end(), wc, wc + got);
      if (got == 0) std::this_thread::sleep_for(20us);
    }
    return out;
  }

  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  static constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

  const Verbs* v;
  Options o;
  std::string error;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf;
  bool infiniband = false;
  int gidIndex = 0;
  uint16_t lid = 0;
  ibv_gid gid{};

 private:
  void open(int device) {
    int n = 0;
    ibv_device** list = v->getDeviceList(&n);
    if (!list || device >= n) {
      error = "no device " + std::to_string(device);
      if (list) v->freeDeviceList(list);
      return;
    }
    ctx = v->openDevice(list[device]);
    v->freeDeviceList(list);
    if (!ctx) return fail("openDevice");
    ibv_port_attr pa{};
    if (v->queryPort(ctx, 1, &pa) != 0) return fail("queryPort");
    infiniband = pa.link_layer == IBV_LINK_LAYER_INFINIBAND;
    lid = pa.lid;
    if (!chooseGid(pa.gid_tbl_len)) return fail("no usable GID");
    pd = v->allocPd(ctx);
    if (!pd) return fail("allocPd");
    cq = v->createCq(ctx, o.cqe, nullptr, nullptr, 0);
    if (!cq) return fail("createCq");
    buf.assign(o.bytes, 0);
    mr = v->regMr(pd, buf.data(), buf.size(),
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mr) return fail("regMr");
    ibv_qp_init_attr qa{};
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = o.sigAll;
    qa.cap.max_send_wr = o.sendWr;
    qa.cap.max_recv_wr = o.recvWr;
    qa.cap.max_send_sge = 4;
    qa.cap.max_recv_sge = 4;
    qa.cap.max_inline_data = 256;
    qp = v->createQp(pd, &qa);
    if (!qp) return fail("createQp");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int e = v->modifyQp(qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
      errno = e;
      return fail("modifyQp INIT");
    }
  }

  // InfiniBand: index 0; RoCE: the first v2 entry with an IPv4 address, as the backend does.
  bool chooseGid(int length) {
    for (int i = 0; i < length; ++i) {
      ibv_gid_entry e{};
      if (v->queryGidEx(ctx, 1, static_cast<uint32_t>(i), &e) != 0) continue;
      const bool v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
      if (infiniband || (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4)) {
        gidIndex = i;
        gid = e.gid;
        return true;
      }
    }
    return false;
  }

  void fail(const char* what) { error = std::string(what) + ": " + strerror(errno); }
};

int connectPair(Endpoint& a, Endpoint& b) {
  if (int e = a.connect(b.address())) return e;
  return b.connect(a.address());
}

class IbEmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A short directory: socket paths must fit sockaddr_un's 108 bytes.
    char pattern[] = "/tmp/loom-ibemu-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr) << strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const Verbs* verbs(bool infiniband = false, int devices = 2, bool gdr = false) {
    EmulatorConfig c;
    c.infiniband = infiniband;
    c.devices = devices;
    c.dir = dir_;
    c.gdr = gdr;
    return emulatedVerbs(c);
  }

  std::string dir_;
};

// ---------------------------------------------------------------------------------------

TEST(IbEmulatorSpec, ParsesTheSettingSyntax) {
  auto roce = parseEmulatorSpec("roce");
  ASSERT_TRUE(roce.isOk());
  EXPECT_FALSE(roce->infiniband);
  EXPECT_EQ(roce->devices, 1);
  auto roce2 = parseEmulatorSpec("roce:2");
  ASSERT_TRUE(roce2.isOk());
  EXPECT_EQ(roce2->devices, 2);
  auto ib = parseEmulatorSpec("ib");
  ASSERT_TRUE(ib.isOk());
  EXPECT_TRUE(ib->infiniband);
  EXPECT_EQ(ib->devices, 1);
  auto ib3 = parseEmulatorSpec("ib:3");
  ASSERT_TRUE(ib3.isOk());
  EXPECT_TRUE(ib3->infiniband);
  EXPECT_EQ(ib3->devices, 3);
  EXPECT_FALSE(ib3->gdr);
  auto gdr = parseEmulatorSpec("roce:2,gdr");
  ASSERT_TRUE(gdr.isOk());
  EXPECT_TRUE(gdr->gdr);
  EXPECT_EQ(gdr->devices, 2);
  ASSERT_TRUE(parseEmulatorSpec("ib,gdr").isOk());
  for (const char* bad :
       {"", "rocev2", "ROCE", "roce:", "roce:0", "roce:17", "ib:x", "ib:2:3", "ib:-1", "infiniband",
        "gdr", ",gdr", "roce,gdr,gdr", "roce,GDR", "roce:,gdr"}) {
    auto r = parseEmulatorSpec(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidUsage);
    EXPECT_NE(r.status().message().find(std::string("LOOM_IB_EMULATE=") + bad), std::string::npos)
        << r.status().message();
  }
}

TEST_F(IbEmulatorTest, EqualConfigsShareATable) {
  const Verbs* v = verbs();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v, verbs());
  EXPECT_NE(v, verbs(true));
  EXPECT_NE(std::string(v->provider).find("emulator"), std::string::npos);
  EmulatorConfig none;
  none.devices = 0;
  EXPECT_EQ(emulatedVerbs(none), nullptr);
}

TEST_F(IbEmulatorTest, RocePortsAndGids) {
  const Verbs* v = verbs(false, 2);
  int n = 0;
  ibv_device** list = v->getDeviceList(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(list[2], nullptr);
  EXPECT_STREQ(v->getDeviceName(list[0]), "loomemu0");
  EXPECT_STREQ(v->getDeviceName(list[1]), "loomemu1");
  ibv_context* c0 = v->openDevice(list[0]);
  ibv_context* c1 = v->openDevice(list[1]);
  v->freeDeviceList(list);
  ASSERT_NE(c0, nullptr);
  ASSERT_NE(c1, nullptr);
  EXPECT_NE(c0->device, nullptr);

  ibv_device_attr d0{}, d1{};
  ASSERT_EQ(v->queryDevice(c0, &d0), 0);
  ASSERT_EQ(v->queryDevice(c1, &d1), 0);
  EXPECT_STREQ(d0.fw_ver, "loom-emulator");
  EXPECT_EQ(d0.phys_port_cnt, 1);
  EXPECT_EQ(d0.max_qp, 16384);
  EXPECT_EQ(d0.max_qp_wr, 8192);
  EXPECT_EQ(d0.max_sge, 4);
  EXPECT_EQ(d0.max_cq, 16384);
  EXPECT_EQ(d0.max_cqe, 65536);
  EXPECT_EQ(d0.max_mr, 65536);
  EXPECT_EQ(d0.max_mr_size, uint64_t{1} << 40);
  EXPECT_NE(d0.node_guid, 0u);
  EXPECT_NE(d0.node_guid, d1.node_guid);

  ibv_port_attr pa{};
  ASSERT_EQ(v->queryPort(c0, 1, &pa), 0);
  EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(pa.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(pa.lid, 0);
  EXPECT_EQ(portSpeedMbps(pa.active_width, pa.active_speed), 400000);
  ibv_port_attr none{};
  EXPECT_EQ(v->queryPort(c0, 2, &none), EINVAL);

  ASSERT_GE(pa.gid_tbl_len, 4);
  ibv_gid_entry e0{}, e1{};
  ASSERT_EQ(v->queryGidEx(c0, 1, 0, &e0), 0);
  ASSERT_EQ(v->queryGidEx(c0, 1, 1, &e1), 0);
  EXPECT_EQ(e0.gid.raw[0], 0xfe);
  EXPECT_EQ(e0.gid.raw[1], 0x80);
  EXPECT_EQ(e0.gid_type, IBV_GID_TYPE_ROCE_V1);
  EXPECT_EQ(e1.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(std::memcmp(e0.gid.raw, e1.gid.raw, 16), 0);
  bool v4v2 = false;
  for (int i = 2; i < pa.gid_tbl_len; ++i) {
    ibv_gid_entry e{};
    ASSERT_EQ(v->queryGidEx(c0, 1, static_cast<uint32_t>(i), &e), 0);
    EXPECT_EQ(e.gid.raw[10], 0xff);
    EXPECT_EQ(e.gid.raw[11], 0xff);
    EXPECT_NE(e.ndev_ifindex, 0u);
    v4v2 = v4v2 || e.gid_type == IBV_GID_TYPE_ROCE_V2;
  }
  EXPECT_TRUE(v4v2);
  ibv_gid_entry past{};
  EXPECT_EQ(v->queryGidEx(c0, 1, static_cast<uint32_t>(pa.gid_tbl_len), &past), ENODATA);
  EXPECT_EQ(v->queryGidEx(c0, 2, 0, &past), EINVAL);
  ibv_gid_entry other{};
  ASSERT_EQ(v->queryGidEx(c1, 1, 0, &other), 0);
  EXPECT_NE(std::memcmp(e0.gid.raw, other.gid.raw, 16), 0);  // each device its own

  ibv_pd* pd = v->allocPd(c0);
  ASSERT_NE(pd, nullptr);
  errno = 0;
  EXPECT_EQ(v->regDmabufMr(pd, 0, 4096, 0, 3, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(v->deallocPd(pd), 0);
  EXPECT_EQ(v->closeDevice(c0), 0);
  EXPECT_EQ(v->closeDevice(c1), 0);
}

// With gdr, dma-buf registration is there (NCCL's probe, fd -1, fails with another error than
// EOPNOTSUPP) but takes only GPU memory of this process behind an open descriptor; without a
// GPU, host memory is refused with EINVAL. Host memory registers as before.
TEST_F(IbEmulatorTest, GdrTakesDmaBufOfGpuMemoryOnly) {
  const Verbs* v = verbs(false, 1, true);
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(v->emulatedGdr);
  EXPECT_FALSE(verbs(false, 1)->emulatedGdr);
  int n = 0;
  ibv_device** list = v->getDeviceList(&n);
  ASSERT_EQ(n, 1);
  ibv_context* c = v->openDevice(list[0]);
  v->freeDeviceList(list);
  ASSERT_NE(c, nullptr);
  ibv_pd* pd = v->allocPd(c);
  ASSERT_NE(pd, nullptr);
  errno = 0;
  EXPECT_EQ(v->regDmabufMr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EBADF);
  std::vector<char> host(8192);
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  errno = 0;
  EXPECT_EQ(v->regDmabufMr(pd, 0, host.size(), reinterpret_cast<uint64_t>(host.data()), fd,
                           IBV_ACCESS_LOCAL_WRITE),
            nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(fd);
  ibv_mr* mr = v->regMr(pd, host.data(), host.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(v->deregMr(mr), 0);
  EXPECT_EQ(v->deallocPd(pd), 0);
  EXPECT_EQ(v->closeDevice(c), 0);
}

TEST_F(IbEmulatorTest, HostIdentityNamesTheGids) {
  const Verbs* v = verbs(false, 1);
  auto gid0 = [&]() {
    int n = 0;
    ibv_device** list = v->getDeviceList(&n);
    ibv_context* c = v->openDevice(list[0]);
    v->freeDeviceList(list);
    ibv_gid_entry e{};
    EXPECT_EQ(v->queryGidEx(c, 1, 0, &e), 0);
    EXPECT_EQ(v->closeDevice(c), 0);
    return std::vector<uint8_t>(e.gid.raw, e.gid.raw + 16);
  };
  setenv("LOOM_HOST_ID", "emulated-host-a", 1);
  const auto a = gid0();
  setenv("LOOM_HOST_ID", "emulated-host-b", 1);
  const auto b = gid0();
  setenv("LOOM_HOST_ID", "emulated-host-a", 1);
  const auto again = gid0();
  unsetenv("LOOM_HOST_ID");
  EXPECT_NE(a, b);
  EXPECT_EQ(a, again);
}

TEST_F(IbEmulatorTest, InfinibandPort) {
  const Verbs* v = verbs(true, 2);
  int n = 0;
  ibv_device** list = v->getDeviceList(&n);
  ASSERT_EQ(n, 2);
  ibv_context* c = v->openDevice(list[0]);
  v->freeDeviceList(list);
  ASSERT_NE(c, nullptr);
  ibv_port_attr pa{};
  ASSERT_EQ(v->queryPort(c, 1, &pa), 0);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_NE(pa.lid, 0);
  EXPECT_LT(pa.lid, 0xc000);
  EXPECT_EQ(portSpeedMbps(pa.active_width, pa.active_speed), 400000);
  ASSERT_EQ(pa.gid_tbl_len, 1);
  ibv_gid_entry e{};
  ASSERT_EQ(v->queryGidEx(c, 1, 0, &e), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_IB);
  EXPECT_EQ(e.gid.raw[0], 0xfe);
  EXPECT_EQ(v->queryGidEx(c, 1, 1, &e), ENODATA);
  EXPECT_EQ(v->closeDevice(c), 0);

  // Queue pairs connect by LID.
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 70000, 3);
  ASSERT_EQ(a.write(1, 0, 70000, b.address(), 0), 0);
  auto wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 70000), 0);
}

TEST_F(IbEmulatorTest, QueuePairStateMachine) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;

  ibv_qp_init_attr qa{};
  qa.send_cq = a.cq;
  qa.recv_cq = a.cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  errno = 0;
  EXPECT_EQ(v->createQp(a.pd, &qa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 9000;
  EXPECT_EQ(v->createQp(a.pd, &qa), nullptr);
  qa.cap.max_send_wr = 4;
  qa.cap.max_inline_data = 512;
  EXPECT_EQ(v->createQp(a.pd, &qa), nullptr);
  qa.cap.max_inline_data = 0;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp* qp = v->createQp(a.pd, &qa);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qa.cap.max_inline_data, 256u);
  EXPECT_EQ(qp->state, IBV_QPS_RESET);
  EXPECT_EQ(qp->qp_type, IBV_QPT_RC);
  EXPECT_LT(qp->qp_num, 1u << 24);

  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(v->postRecv(qp, &rwr, &rbad), EINVAL);  // RESET takes no receives
  EXPECT_EQ(rbad, &rwr);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(v->modifyQp(qp, &attr, Endpoint::kRtrMask), EINVAL);  // RESET -> RTR
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(v->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  attr.port_num = 2;
  EXPECT_EQ(
      v->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      EINVAL);
  attr.port_num = 1;
  ASSERT_EQ(
      v->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      0);
  EXPECT_EQ(qp->state, IBV_QPS_INIT);

  char byte = 0;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(&byte);
  sge.length = 1;
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_RDMA_WRITE;
  swr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  ibv_send_wr* sbad = nullptr;
  EXPECT_EQ(v->postSend(qp, &swr, &sbad), EINVAL);  // not in RTS
  EXPECT_EQ(sbad, &swr);
  EXPECT_EQ(v->postRecv(qp, &rwr, &rbad), 0);  // INIT takes receives

  const Address peer = b.address();
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = IBV_MTU_4096;
  rtr.dest_qp_num = peer.qpn;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.port_num = 1;
  EXPECT_EQ(v->modifyQp(qp, &rtr, Endpoint::kRtrMask), EINVAL);  // RoCE needs the GRH
  rtr.ah_attr.is_global = 1;
  std::memcpy(rtr.ah_attr.grh.dgid.raw, peer.gid, 16);
  rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(a.gidIndex);
  EXPECT_EQ(v->modifyQp(qp, &rtr, Endpoint::kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  ASSERT_EQ(v->modifyQp(qp, &rtr, Endpoint::kRtrMask), 0);
  EXPECT_EQ(qp->state, IBV_QPS_RTR);
  EXPECT_EQ(v->postSend(qp, &swr, &sbad), EINVAL);  // RTR: still no sends

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.max_rd_atomic = 1;
  EXPECT_EQ(v->modifyQp(qp, &rts, Endpoint::kRtsMask & ~IBV_QP_RETRY_CNT), EINVAL);
  rts.retry_cnt = 8;
  EXPECT_EQ(v->modifyQp(qp, &rts, Endpoint::kRtsMask), EINVAL);
  rts.retry_cnt = 7;
  ASSERT_EQ(v->modifyQp(qp, &rts, Endpoint::kRtsMask), 0);
  EXPECT_EQ(qp->state, IBV_QPS_RTS);

  ibv_qp_attr back{};
  back.qp_state = IBV_QPS_INIT;
  EXPECT_EQ(v->modifyQp(qp, &back, IBV_QP_STATE), EINVAL);  // RTS -> INIT
  back.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(v->modifyQp(qp, &back, Endpoint::kRtrMask), EINVAL);
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(v->modifyQp(qp, &err, IBV_QP_STATE), 0);
  EXPECT_EQ(v->modifyQp(qp, &rts, Endpoint::kRtsMask), EINVAL);  // ERR -> RTS
  // The receive posted in INIT is flushed.
  auto wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num);
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(v->modifyQp(qp, &reset, IBV_QP_STATE), 0);
  ASSERT_EQ(
      v->modifyQp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      0);
  EXPECT_EQ(v->destroyQp(qp), 0);
}

TEST_F(IbEmulatorTest, BusyResourcesAndAccessFlags) {
  const Verbs* v = verbs();
  Endpoint a(v, 0);
  ASSERT_TRUE(a.ok()) << a.error;
  EXPECT_EQ(v->deallocPd(a.pd), EBUSY);     // the MR and QP use it
  EXPECT_EQ(v->destroyCq(a.cq), EBUSY);     // the QP uses it
  EXPECT_EQ(v->closeDevice(a.ctx), EBUSY);  // PD and CQ remain
  std::vector<uint8_t> mem(8192);
  errno = 0;
  EXPECT_EQ(v->regMr(a.pd, mem.data(), mem.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);  // remote write needs local write
  EXPECT_EQ(v->regMr(a.pd, mem.data(), 0, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(v->regMr(a.pd, mem.data(), mem.size(), IBV_ACCESS_ON_DEMAND), nullptr);
  ibv_mr* m1 = v->regMr(a.pd, mem.data(), 4096, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* m2 = v->regMr(a.pd, mem.data() + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(m1, nullptr);
  ASSERT_NE(m2, nullptr);
  EXPECT_EQ(m1->addr, mem.data());
  EXPECT_EQ(m1->length, 4096u);
  EXPECT_EQ(m1->pd, a.pd);
  EXPECT_EQ(m1->context, a.ctx);
  EXPECT_NE(m1->lkey, m1->rkey);
  EXPECT_NE(m1->lkey, m2->lkey);
  EXPECT_NE(m1->rkey, m2->rkey);
  EXPECT_EQ(v->deregMr(m1), 0);
  EXPECT_EQ(v->deregMr(m2), 0);
  ibv_cq* small = v->createCq(a.ctx, 0, nullptr, nullptr, 0);
  EXPECT_EQ(small, nullptr);
  EXPECT_STREQ(v->wcStatusStr(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_STREQ(v->wcStatusStr(IBV_WC_REM_ACCESS_ERR), "remote access error");
}

TEST_F(IbEmulatorTest, WriteLandsExactly) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), a.buf.size(), 1);
  const size_t len = 300000, from = 1000, to = 5000;
  // An unsignaled write, then a signaled one: one completion, for the second.
  ASSERT_EQ(a.write(1, from, len, b.address(), to, std::nullopt, 0), 0);
  ASSERT_EQ(a.write(2, from, 10, b.address(), to + len + 100), 0);
  auto wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].qp_num, a.qp->qp_num);
  EXPECT_EQ(std::memcmp(b.buf.data() + to, a.buf.data() + from, len), 0);
  for (size_t i = 0; i < to; ++i) ASSERT_EQ(b.buf[i], 0) << i;
  for (size_t i = to + len; i < to + len + 100; ++i) ASSERT_EQ(b.buf[i], 0) << i;
  EXPECT_EQ(std::memcmp(b.buf.data() + to + len + 100, a.buf.data() + from, 10), 0);
  for (size_t i = to + len + 110; i < b.buf.size(); ++i) ASSERT_EQ(b.buf[i], 0) << i;
  EXPECT_TRUE(a.wait(1, 20ms).empty());
}

TEST_F(IbEmulatorTest, WriteWithImmConsumesAReceive) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 4096, 2);
  ASSERT_EQ(b.postRecv(77), 0);
  ASSERT_EQ(b.postRecv(78), 0);
  ASSERT_EQ(a.write(5, 0, 4096, b.address(), 0, 0xdeadbeef), 0);
  ASSERT_EQ(a.write(6, 0, 0, b.address(), 0, 42), 0);  // zero bytes, an immediate
  auto sent = a.wait(2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[0].wr_id, 5u);
  EXPECT_EQ(sent[1].wr_id, 6u);
  auto got = b.wait(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_TRUE(got[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(got[0].imm_data, htonl(0xdeadbeef));
  EXPECT_EQ(got[0].byte_len, 4096u);
  EXPECT_EQ(got[0].wr_id, 77u);
  EXPECT_EQ(got[0].qp_num, b.qp->qp_num);
  EXPECT_EQ(got[1].wr_id, 78u);
  EXPECT_EQ(got[1].byte_len, 0u);
  EXPECT_EQ(got[1].imm_data, htonl(42));
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 4096), 0);
}

TEST_F(IbEmulatorTest, CompletionsKeepPostingOrder) {
  Options o;
  o.bytes = 3 << 20;
  const Verbs* v = verbs();
  Endpoint a(v, 0, o), b(v, 1, o);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), a.buf.size(), 9);
  const size_t sizes[] = {0, 1, 4095, 65537, size_t{1} << 20};
  const int kWrs = 60;
  std::vector<uint8_t> expect(b.buf.size(), 0);
  std::vector<uint64_t> signaled;
  std::vector<size_t> immSizes;
  for (int i = 0; i < kWrs; ++i) {
    if (i % 2) {
      ASSERT_EQ(b.postRecv(1000 + immSizes.size()), 0);
      immSizes.push_back(sizes[i % 5]);
    }
  }
  size_t immIndex = 0;
  for (int i = 0; i < kWrs; ++i) {
    const size_t len = sizes[i % 5], from = (i * 7919) % 4096, to = (i * 104729) % 8192;
    const bool imm = i % 2;
    const unsigned flags = i % 3 == 2 ? 0 : IBV_SEND_SIGNALED;
    if (flags) signaled.push_back(i);
    ASSERT_EQ(
        a.write(i, from, len, b.address(), to,
                imm ? std::optional<uint32_t>(static_cast<uint32_t>(i)) : std::nullopt, flags),
        0);
    std::memcpy(expect.data() + to, a.buf.data() + from, len);  // later writes win
    immIndex += imm;
  }
  auto sent = a.wait(signaled.size());
  ASSERT_EQ(sent.size(), signaled.size());
  for (size_t k = 0; k < sent.size(); ++k) {
    EXPECT_EQ(sent[k].status, IBV_WC_SUCCESS);
    EXPECT_EQ(sent[k].wr_id, signaled[k]) << k;
  }
  auto got = b.wait(immSizes.size());
  ASSERT_EQ(got.size(), immSizes.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].status, IBV_WC_SUCCESS);
    EXPECT_EQ(got[k].wr_id, 1000 + k);
    EXPECT_EQ(got[k].byte_len, immSizes[k]) << k;
    EXPECT_EQ(got[k].imm_data, htonl(static_cast<uint32_t>(2 * k + 1))) << k;
  }
  EXPECT_EQ(immIndex, immSizes.size());
  EXPECT_EQ(std::memcmp(expect.data(), b.buf.data(), expect.size()), 0);
  EXPECT_TRUE(a.wait(1, 20ms).empty());
}

TEST_F(IbEmulatorTest, SendsInlineAndScattered) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);

  // Inline: the bytes are taken at post time.
  uint8_t src[200];
  fillPattern(src, sizeof src, 4);
  uint8_t original[200];
  std::memcpy(original, src, sizeof src);
  ASSERT_EQ(b.postRecv(1, 0, 256), 0);
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(src);
  sge.length = sizeof src;
  ibv_send_wr wr{};
  wr.wr_id = 11;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(v->postSend(a.qp, &wr, &bad), 0);
  std::memset(src, 0, sizeof src);
  auto sent = a.wait(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[0].opcode, IBV_WC_SEND);
  auto got = b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(got[0].byte_len, sizeof src);
  EXPECT_FALSE(got[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(std::memcmp(b.buf.data(), original, sizeof original), 0);

  // Too much for inline: refused at post.
  std::vector<uint8_t> big(300);
  sge.addr = reinterpret_cast<uintptr_t>(big.data());
  sge.length = 300;
  EXPECT_EQ(v->postSend(a.qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);

  // A send of several segments from two gather elements into two scatter elements.
  const size_t n = 150000;
  fillPattern(a.buf.data(), n, 5);
  ibv_sge rs[2] = {};
  rs[0].addr = reinterpret_cast<uintptr_t>(b.buf.data()) + 1000;
  rs[0].length = 70001;
  rs[0].lkey = b.mr->lkey;
  rs[1].addr = reinterpret_cast<uintptr_t>(b.buf.data()) + 500000;
  rs[1].length = 200000;
  rs[1].lkey = b.mr->lkey;
  ibv_recv_wr rwr{};
  rwr.wr_id = 2;
  rwr.sg_list = rs;
  rwr.num_sge = 2;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(v->postRecv(b.qp, &rwr, &rbad), 0);
  ibv_sge ss[2] = {};
  ss[0].addr = reinterpret_cast<uintptr_t>(a.buf.data());
  ss[0].length = 12345;
  ss[0].lkey = a.mr->lkey;
  ss[1].addr = reinterpret_cast<uintptr_t>(a.buf.data()) + 12345;
  ss[1].length = n - 12345;
  ss[1].lkey = a.mr->lkey;
  ibv_send_wr swr{};
  swr.wr_id = 12;
  swr.opcode = IBV_WR_SEND_WITH_IMM;
  swr.imm_data = htonl(7);
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.sg_list = ss;
  swr.num_sge = 2;
  ASSERT_EQ(v->postSend(a.qp, &swr, &bad), 0);
  sent = a.wait(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  got = b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].byte_len, n);
  EXPECT_EQ(got[0].imm_data, htonl(7));
  EXPECT_EQ(std::memcmp(b.buf.data() + 1000, a.buf.data(), 70001), 0);
  EXPECT_EQ(std::memcmp(b.buf.data() + 500000, a.buf.data() + 70001, n - 70001), 0);
}

// The requester's completions after a remote access error: that WR's error, then flushes;
// the responder flushes its receives.
void expectAccessErrorThenFlush(Endpoint& a, Endpoint& b) {
  auto wc = a.wait(3);
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[2].wr_id, 3u);
  auto flushed = b.wait(2);
  ASSERT_EQ(flushed.size(), 2u);
  EXPECT_EQ(flushed[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(flushed[0].wr_id, 100u);
  EXPECT_EQ(flushed[1].wr_id, 101u);
  // Later posts to a QP in error complete flushed.
  ASSERT_EQ(a.write(4, 0, 8, b.address(), 0), 0);
  wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
  for (uint8_t byte : b.buf) ASSERT_EQ(byte, 0);
}

TEST_F(IbEmulatorTest, BadRkeyIsRemoteAccessError) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 4096, 6);
  ASSERT_EQ(b.postRecv(100), 0);
  ASSERT_EQ(b.postRecv(101), 0);
  ASSERT_EQ(
      a.write(1, 0, 64, b.address(), 0, std::nullopt, IBV_SEND_SIGNALED, b.mr->rkey ^ 0x5a5a5a5a),
      0);
  ASSERT_EQ(a.write(2, 0, 64, b.address(), 0), 0);
  ASSERT_EQ(a.write(3, 0, 64, b.address(), 0, 9u), 0);
  expectAccessErrorThenFlush(a, b);
}

TEST_F(IbEmulatorTest, OutOfBoundsIsRemoteAccessError) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 4096, 7);
  ASSERT_EQ(b.postRecv(100), 0);
  ASSERT_EQ(b.postRecv(101), 0);
  ASSERT_EQ(a.write(1, 0, 4096, b.address(), b.buf.size() - 100), 0);  // 3996 bytes too far
  ASSERT_EQ(a.write(2, 0, 64, b.address(), 0), 0);
  ASSERT_EQ(a.write(3, 0, 64, b.address(), 0), 0);
  expectAccessErrorThenFlush(a, b);
}

TEST_F(IbEmulatorTest, BadLkeyIsLocalProtectionError) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  ASSERT_EQ(a.write(1, 0, 64, b.address(), 0), 0);
  ASSERT_EQ(a.write(2, 0, 64, b.address(), 0, std::nullopt, IBV_SEND_SIGNALED, 0,
                    a.mr->lkey ^ 0x5a5a5a5a),
            0);
  ASSERT_EQ(a.write(3, 0, 64, b.address(), 0), 0);
  auto wc = a.wait(3);
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(IbEmulatorTest, ReceiverNotReadyExhaustsRnrRetry) {
  Options requester;
  requester.rnrRetry = 2;
  const Verbs* v = verbs();
  Endpoint a(v, 0, requester), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  ASSERT_EQ(a.write(1, 0, 64, b.address(), 0, 1u), 0);  // no receive posted
  ASSERT_EQ(a.write(2, 0, 64, b.address(), 0), 0);
  auto wc = a.wait(2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(IbEmulatorTest, ReceiverReadyInTimeSucceeds) {
  Options responder;
  responder.minRnrTimer = 12;  // 0.64 ms between tries
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1, responder);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 100000, 8);
  ASSERT_EQ(a.write(1, 0, 100000, b.address(), 0, 5u), 0);
  ASSERT_EQ(a.write(2, 0, 10, b.address(), 200000), 0);
  std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(a.wait(1, 1ms).empty());
  ASSERT_EQ(b.postRecv(50), 0);
  auto wc = a.wait(2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
  auto got = b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 50u);
  EXPECT_EQ(got[0].byte_len, 100000u);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 100000), 0);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data() + 200000, 10), 0);
}

TEST_F(IbEmulatorTest, CqOverflowPutsTheCqInError) {
  Options o;
  o.cqe = 2;
  const Verbs* v = verbs();
  Endpoint a(v, 0, o), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(a.write(i, 0, 8, b.address(), 0), 0);
  const auto deadline = Clock::now() + 3s;
  int rc = 0;
  while ((rc = v->pollCq(a.cq, 0, nullptr)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(100us);
  }
  EXPECT_EQ(rc, -1);
}

TEST_F(IbEmulatorTest, DestroyWithWorkOutstanding) {
  Options o;
  o.bytes = 4 << 20;
  const Verbs* v = verbs();
  auto a = std::make_unique<Endpoint>(v, 0, o);
  auto b = std::make_unique<Endpoint>(v, 1, o);
  ASSERT_TRUE(a->ok()) << a->error;
  ASSERT_TRUE(b->ok()) << b->error;
  ASSERT_EQ(connectPair(*a, *b), 0);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a->write(i, 0, o.bytes, b->address(), 0), 0);
  a.reset();  // the QP goes first, then its memory
  b.reset();
}

TEST_F(IbEmulatorTest, ManySmallMessages) {
  const Verbs* v = verbs();
  Options o;
  o.sendWr = o.recvWr = 256;
  Endpoint a(v, 0, o), b(v, 1, o);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  const int kMessages = 20000, kWindow = 128;
  for (int i = 0; i < kWindow; ++i) ASSERT_EQ(b.postRecv(i), 0);
  int posted = 0, sent = 0, received = 0;
  const auto start = Clock::now();
  ibv_wc wc[64];
  while ((sent < kMessages || received < kMessages) && Clock::now() - start < 20s) {
    while (posted < kMessages && posted - received < kWindow && posted - sent < kWindow) {
      ASSERT_EQ(a.write(posted, posted % 4096, 8, b.address(), 0, static_cast<uint32_t>(posted)),
                0);
      ++posted;
    }
    const int s = v->pollCq(a.cq, 64, wc);
    ASSERT_GE(s, 0);
    for (int i = 0; i < s; ++i) ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(sent++));
    const int r = v->pollCq(b.cq, 64, wc);
    ASSERT_GE(r, 0);
    for (int i = 0; i < r; ++i) {
      ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
      ASSERT_EQ(ntohl(wc[i].imm_data), static_cast<uint32_t>(received));
      ++received;
      ASSERT_EQ(b.postRecv(received + kWindow), 0);
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(sent, kMessages);
  EXPECT_EQ(received, kMessages);
  std::printf("%d writes with immediate of 8 bytes in %.3f s: %.0f/s\n", kMessages, s,
              kMessages / s);
}

TEST_F(IbEmulatorTest, WriteBeforeThePeerIsReadyIsRetransmitted) {
  Options requester;
  requester.timeout = 12;  // 16.8 ms, seven times
  const Verbs* v = verbs();
  Endpoint a(v, 0, requester), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(a.connect(b.address()), 0);
  fillPattern(a.buf.data(), 100000, 10);
  ASSERT_EQ(a.write(1, 0, 100000, b.address(), 0), 0);  // b, in INIT, drops it
  std::this_thread::sleep_for(20ms);
  ASSERT_EQ(b.connect(a.address()), 0);
  auto wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 100000), 0);
}

TEST_F(IbEmulatorTest, RecoversThroughReset) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  ASSERT_EQ(a.write(1, 0, 64, b.address(), 0, std::nullopt, IBV_SEND_SIGNALED, 1), 0);
  auto wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);  // both QPs are in error now
  for (Endpoint* e : {&a, &b}) {
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(v->modifyQp(e->qp, &reset, IBV_QP_STATE), 0);
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.port_num = 1;
    init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(v->modifyQp(e->qp, &init,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
              0);
  }
  ASSERT_EQ(connectPair(a, b), 0);
  fillPattern(a.buf.data(), 5000, 11);
  ASSERT_EQ(b.postRecv(3), 0);
  ASSERT_EQ(a.write(2, 0, 5000, b.address(), 0, 1u), 0);
  wc = a.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  auto got = b.wait(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wr_id, 3u);
  EXPECT_EQ(std::memcmp(a.buf.data(), b.buf.data(), 5000), 0);
}

TEST_F(IbEmulatorTest, IdleNicSleeps) {
  const Verbs* v = verbs();
  Endpoint a(v, 0), b(v, 1);
  ASSERT_TRUE(a.ok()) << a.error;
  ASSERT_TRUE(b.ok()) << b.error;
  ASSERT_EQ(connectPair(a, b), 0);
  ASSERT_EQ(a.write(1, 0, 64, b.address(), 0), 0);
  ASSERT_EQ(a.wait(1).size(), 1u);
  auto cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  const double before = cpu();
  std::this_thread::sleep_for(300ms);
  const double used = cpu() - before;
  EXPECT_LT(used, 30.0) << "ms of CPU in 300 ms idle: the NIC threads should sleep in ppoll";
}

// ---------------------------------------------------------------------------------------
// Between processes. The child forks before any device is open (as libibverbs wants) and
// the two exchange their addresses through pipes.

struct Pipes {
  int toChild[2] = {-1, -1};
  int toParent[2] = {-1, -1};
  bool open() { return pipe(toChild) == 0 && pipe(toParent) == 0; }
  void closeAll() {
    for (int fd : {toChild[0], toChild[1], toParent[0], toParent[1]})
      if (fd >= 0) ::close(fd);
  }
};

bool sendAll(int fd, const void* p, size_t n) {
  return ::write(fd, p, n) == static_cast<ssize_t>(n);
}
bool recvAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::read(fd, c, n);
    if (got <= 0) return false;
    c += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// Trades addresses, connects, and trades a "ready" byte, so neither writes before the
// other is at RTS.
bool handshake(Endpoint& e, int out, int in, Address* peer) {
  const Address mine = e.address();
  char ready = 'r';
  return sendAll(out, &mine, sizeof mine) && recvAll(in, peer, sizeof *peer) &&
         e.connect(*peer) == 0 && sendAll(out, &ready, 1) && recvAll(in, &ready, 1);
}

// The child's side of WorksAcrossProcesses: receives a write with immediate and writes the
// bytes back. Its exit status says what failed.
int echoChild(const Verbs* v, Pipes& p, size_t len) {
  Endpoint e(v, 1);
  if (!e.ok()) return 2;
  if (e.postRecv(1) != 0) return 3;
  Address peer;
  if (!handshake(e, p.toParent[1], p.toChild[0], &peer)) return 4;
  auto got = e.wait(1);
  if (got.size() != 1 || got[0].status != IBV_WC_SUCCESS || got[0].byte_len != len ||
      ntohl(got[0].imm_data) != 77) {
    return 5;
  }
  std::vector<uint8_t> expect(len);
  fillPattern(expect.data(), len, 77);
  if (std::memcmp(expect.data(), e.buf.data(), len) != 0) return 6;
  if (e.write(2, 0, len, peer, 0, 78u) != 0) return 7;
  auto sent = e.wait(1);
  if (sent.size() != 1 || sent[0].status != IBV_WC_SUCCESS) return 8;
  return 0;
}

TEST_F(IbEmulatorTest, WorksAcrossProcesses) {
  const Verbs* v = verbs();
  Pipes p;
  ASSERT_TRUE(p.open());
  const size_t len = 200000;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int code = echoChild(v, p, len);
    _exit(code);
  }
  {
    Endpoint e(v, 0);
    ASSERT_TRUE(e.ok()) << e.error;
    ASSERT_EQ(e.postRecv(9), 0);
    Address peer;
    ASSERT_TRUE(handshake(e, p.toChild[1], p.toParent[0], &peer));
    fillPattern(e.buf.data() + 500000, len, 77);
    ASSERT_EQ(e.write(1, 500000, len, peer, 0, 77u), 0);
    auto wc = e.wait(2);  // our write's completion and the echo's receive
    ASSERT_EQ(wc.size(), 2u);
    for (const ibv_wc& w : wc) {
      EXPECT_EQ(w.status, IBV_WC_SUCCESS);
      if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        EXPECT_EQ(w.wr_id, 9u);
        EXPECT_EQ(ntohl(w.imm_data), 78u);
        EXPECT_EQ(w.byte_len, len);
      }
    }
    EXPECT_EQ(std::memcmp(e.buf.data(), e.buf.data() + 500000, len), 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  p.closeAll();
}

TEST_F(IbEmulatorTest, KilledPeerEndsInRetryExceeded) {
  const Verbs* v = verbs();
  Pipes p;
  ASSERT_TRUE(p.open());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Endpoint e(v, 1);
    Address peer;
    if (!e.ok() || !handshake(e, p.toParent[1], p.toChild[0], &peer)) _exit(2);
    for (;;) pause();  // answers as responder until killed
  }
  Options o;
  o.timeout = 10;  // 4.2 ms
  o.retryCnt = 2;  // three timeouts: about 12.6 ms
  Endpoint e(v, 0, o);
  ASSERT_TRUE(e.ok()) << e.error;
  Address peer;
  ASSERT_TRUE(handshake(e, p.toChild[1], p.toParent[0], &peer));
  ASSERT_EQ(e.write(1, 0, 1000, peer, 0), 0);
  auto wc = e.wait(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const auto start = Clock::now();
  ASSERT_EQ(e.write(2, 0, 1000, peer, 0), 0);
  ASSERT_EQ(e.write(3, 0, 1000, peer, 0), 0);
  wc = e.wait(2);
  const auto ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_GE(ms, 12.0);
  EXPECT_LT(ms, 1000.0);
  std::printf("retry exceeded after %.1f ms (3 x 4.2 ms expected)\n", ms);
  p.closeAll();
}

}  // namespace
}  // namespace loom::transport::net::ib
