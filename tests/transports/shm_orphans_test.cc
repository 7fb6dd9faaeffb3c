// transports/shm/orphans.h: which segments a sweep removes. A child process holds the
// record lock a live creator holds (a process's own locks never conflict with itself).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "transports/shm/orphans.h"

namespace {

using loom::transport::removeOrphanSegments;

void makeFile(const std::string& path, int ageSeconds) {
  const int fd = open(path.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= ageSeconds;
  t[1] = t[0];
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), t, 0), 0);
}

bool exists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

TEST(ShmOrphans, OnlyOldUnlockedSegmentsGo) {
  char tmpl[] = "/tmp/loom-orphans-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string orphan = dir + "/loom-0123456789abcdef-0-1-00000001";
  const std::string young = dir + "/loom-0123456789abcdef-0-1-00000002";
  const std::string locked = dir + "/loom-0123456789abcdef-1-0-00000003";
  const std::string other = dir + "/loom-posts-123-00000004";
  makeFile(orphan, 120);
  makeFile(young, 0);
  makeFile(locked, 120);
  makeFile(other, 120);
  // A live creator: a child holding the lock on byte 0.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    const int fd = open(locked.c_str(), O_RDWR);
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_start = 0;
    l.l_len = 1;
    const char ok = fd >= 0 && fcntl(fd, F_SETLK, &l) == 0 ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');
  EXPECT_EQ(removeOrphanSegments(dir, 60), 1u);
  EXPECT_FALSE(exists(orphan));
  EXPECT_TRUE(exists(young));
  EXPECT_TRUE(exists(locked));
  EXPECT_TRUE(exists(other));
  // Its creator gone (SIGKILL drops the lock), the locked one is an orphan too.
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(removeOrphanSegments(dir, 60), 1u);
  EXPECT_FALSE(exists(locked));
  for (const auto& p : {young, other}) unlink(p.c_str());
  rmdir(dir.c_str());
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
