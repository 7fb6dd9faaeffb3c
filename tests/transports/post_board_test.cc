// The registration post board (transports/p2p/post_board.h): every rank decides every call
// alike whenever the activation happens, posts arrive intact through many turns of the
// ring, waits end with a clear error, the export table, and the shared-memory set-up
// between two processes.
#include "transports/p2p/post_board.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace loom::transport::p2p {
namespace {

// What rank r posts for call s: known to every rank, so each can check what it read.
Post postFor(int r, uint64_t s) {
  Post p;
  p.readable = static_cast<uint32_t>((s + r) % 3 != 0);
  p.entry = static_cast<uint32_t>((s * 7 + r) % kExportSlots);
  p.generation = s * 1000 + r + 1;
  p.offset = s * 64 + r;
  return p;
}

struct Memory {
  explicit Memory(int n)
      : bytes(PostBoard::bytesFor(n)), data(new (std::align_val_t(64)) char[bytes]()) {}
  ~Memory() { operator delete[](data, std::align_val_t(64)); }
  size_t bytes;
  char* data;
};

// Threads as ranks; rank r calls want() before call at[r] (at[r] < 0: never). Every rank
// must read the posts of the same calls (all from one call on), and find them intact.
void runThreads(int n, uint64_t calls, const std::vector<int64_t>& at, unsigned seed) {
  Memory mem(n);
  std::vector<int64_t> firstActive(n, -1);
  std::vector<std::string> failures(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      PostBoard board(mem.data, r, n);
      std::mt19937 rng(seed * 31 + r);
      std::vector<Post> all;
      for (uint64_t s = 0; s < calls; ++s) {
        if (at[r] >= 0 && s == static_cast<uint64_t>(at[r])) board.want();
        if (rng() % 16 == 0) std::this_thread::yield();
        auto read = board.exchange(s, postFor(r, s), &all, 20000);
        if (!read) {
          failures[r] = read.status().message();
          return;
        }
        if (!read.value()) {
          if (firstActive[r] >= 0) {
            failures[r] = "call " + std::to_string(s) + " not read after call " +
                          std::to_string(firstActive[r]) + " was";
            return;
          }
          continue;
        }
        if (firstActive[r] < 0) firstActive[r] = static_cast<int64_t>(s);
        for (int q = 0; q < n; ++q) {
          Post want = postFor(q, s);
          if (all[q].readable != want.readable || all[q].entry != want.entry ||
              all[q].generation != want.generation || all[q].offset != want.offset) {
            failures[r] = "call " + std::to_string(s) + ": rank " + std::to_string(q) +
                          "'s post arrived changed";
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  bool anyWant = false;
  for (int64_t a : at) anyWant = anyWant || a >= 0;
  // Reading starts at the call the activation chose (E), when the ranks got that far: a
  // rank that wanted late may find the others done with every call already.
  const uint64_t e = PostBoard(mem.data, 0, n).activeFrom();
  EXPECT_EQ(e != 0, anyWant);
  const int64_t expected = e != 0 && e < calls ? static_cast<int64_t>(e) : -1;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(firstActive[r], expected) << "rank " << r << " (E = " << e << ")";
  }
}

TEST(PostBoard, NobodyReadsWhileNobodyRegistered) {
  runThreads(3, 3 * kPostRing, {-1, -1, -1}, 1);
}

TEST(PostBoard, EveryRankDecidesEveryCallAlike) {
  // Activation early, late, by one rank or several at once, on 2, 3 and 8 ranks; the ring
  // (kPostRing posts) turns several times after it.
  int seed = 0;
  for (int n : {2, 3, 8}) {
    for (int64_t when : {int64_t(0), int64_t(5), int64_t(300)}) {
      std::vector<int64_t> one(n, -1), all(n, when);
      one[n - 1] = when;
      runThreads(n, 4 * kPostRing, one, ++seed);
      runThreads(n, 4 * kPostRing, all, ++seed);
    }
  }
}

TEST(PostBoard, MissingPeerTimesOutNamingIt) {
  Memory mem(2);
  PostBoard a(mem.data, 0, 2), b(mem.data, 1, 2);
  std::vector<Post> all;
  a.want();
  // Rank 1 posts call 0 only; rank 0 activates at call 0, so call 1 is read and waits.
  ASSERT_TRUE(b.exchange(0, postFor(1, 0), &all, 1000).isOk());
  auto first = a.exchange(0, postFor(0, 0), &all, 1000);
  ASSERT_TRUE(first.isOk());
  EXPECT_FALSE(first.value());
  auto t0 = std::chrono::steady_clock::now();
  auto second = a.exchange(1, postFor(0, 1), &all, 200);
  ASSERT_FALSE(second.isOk());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  EXPECT_NE(second.status().message().find("rank 1 to post call 1"), std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("LOOM_TIMEOUT_MS"), std::string::npos);
}

TEST(PostBoard, StopEndsAWait) {
  Memory mem(2);
  PostBoard a(mem.data, 0, 2), b(mem.data, 1, 2);
  std::vector<Post> all;
  a.want();
  ASSERT_TRUE(b.exchange(0, postFor(1, 0), &all, 0).isOk());
  ASSERT_TRUE(a.exchange(0, postFor(0, 0), &all, 0).isOk());
  std::atomic<bool> stop{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop = true;
  });
  auto r = a.exchange(1, postFor(0, 1), &all, 0, [&] { return stop.load(); });
  t.join();
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("aborted"), std::string::npos) << r.status().message();
}

TEST(PostBoard, ExportTable) {
  Memory mem(2);
  PostBoard a(mem.data, 0, 2), b(mem.data, 1, 2);
  unsigned char handle[kHandleBytes];
  for (size_t i = 0; i < kHandleBytes; ++i) handle[i] = static_cast<unsigned char>(i * 3 + 1);
  uint64_t g = 0;
  int e = a.publish(0x7f0000001000, 1 << 20, handle, &g);
  ASSERT_GE(e, 0);
  EXPECT_NE(g, 0u);
  Export x;
  ASSERT_TRUE(b.read(0, e, g, &x));
  EXPECT_EQ(x.base, 0x7f0000001000u);
  EXPECT_EQ(x.bytes, 1u << 20);
  EXPECT_EQ(std::memcmp(x.handle, handle, kHandleBytes), 0);
  EXPECT_FALSE(b.read(0, e, g + 1, &x));  // another generation
  EXPECT_FALSE(b.read(1, e, g, &x));      // rank 1 exported nothing
  a.retire(e);
  EXPECT_FALSE(b.read(0, e, g, &x));
  uint64_t g2 = 0;
  EXPECT_EQ(a.publish(0x7f0000002000, 4096, handle, &g2), e);  // the slot is reused
  EXPECT_NE(g2, g);                                            // under a new generation
  for (int i = 1; i < kExportSlots; ++i) EXPECT_GE(a.publish(i, 1, handle, &g), 0);
  EXPECT_EQ(a.publish(1, 1, handle, &g), -1);  // full
  EXPECT_EQ(b.pidOf(0), static_cast<int>(getpid()));
}

// No /dev/shm entry of ours is left behind.
int postBoardFiles() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    const std::string prefix = "loom-posts-";
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

TEST(PostBoard, SharedBetweenTwoProcesses) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const int before = postBoardFiles();
  // Two ranks, one per process: an all-gather over a socket pair.
  auto gatherOver = [](int fd, int rank) {
    return [fd, rank](void* data, size_t size) -> Status {
      char* mine = static_cast<char*>(data) + rank * size;
      char* theirs = static_cast<char*>(data) + (1 - rank) * size;
      if (write(fd, mine, size) != static_cast<ssize_t>(size))
        return errorf(Code::kSystemError, "write");
      size_t got = 0;
      while (got < size) {
        ssize_t k = read(fd, theirs + got, size - got);
        if (k <= 0) return errorf(Code::kSystemError, "read");
        got += static_cast<size_t>(k);
      }
      return Status::ok();
    };
  };
  constexpr uint64_t kCalls = 3 * kPostRing;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(sv[0]);
    auto board = PostBoard::createShared(1, 2, gatherOver(sv[1], 1));
    if (!board) _exit(2);
    std::vector<Post> all;
    int64_t first = -1;
    for (uint64_t s = 0; s < kCalls; ++s) {
      if (s == 40) board.value()->want();
      auto r = board.value()->exchange(s, postFor(1, s), &all, 20000);
      if (!r) _exit(3);
      if (r.value() && first < 0) first = static_cast<int64_t>(s);
      if (r.value() &&
          (all[0].offset != postFor(0, s).offset || all[1].offset != postFor(1, s).offset))
        _exit(4);
      if (!r.value() && first >= 0) _exit(5);
    }
    if (write(sv[1], &first, sizeof(first)) != sizeof(first)) _exit(6);
    _exit(0);
  }
  close(sv[1]);
  auto board = PostBoard::createShared(0, 2, gatherOver(sv[0], 0));
  ASSERT_TRUE(board.isOk()) << board.status().message();
  EXPECT_EQ(postBoardFiles(), before);  // unlinked once both mapped it
  std::vector<Post> all;
  int64_t first = -1;
  for (uint64_t s = 0; s < kCalls; ++s) {
    if (s == 40) board.value()->want();
    auto r = board.value()->exchange(s, postFor(0, s), &all, 20000);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    if (r.value() && first < 0) first = static_cast<int64_t>(s);
  }
  int64_t childFirst = -2;
  ASSERT_EQ(read(sv[0], &childFirst, sizeof(childFirst)), static_cast<ssize_t>(sizeof(childFirst)));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  // Both want their posts read from call 40: whoever gets there first activates, and the
  // other cannot have posted past it, so reading starts at call 41 on both.
  EXPECT_EQ(first, 41);
  EXPECT_EQ(childFirst, first);
  EXPECT_EQ(board.value()->pidOf(1), static_cast<int>(child));
  close(sv[0]);
}

}  // namespace
}  // namespace loom::transport::p2p
