#include "transports/net/ucx/closer.h"

#include <system_error>
#include <utility>

namespace loom::transport::net::ucx {

Closer::~Closer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  queue_.clear();  // the thread never started: close them here
}

void Closer::close(std::unique_ptr<Striped> comm) {
  if (!comm) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!thread_.joinable() && !stop_) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      lock.unlock();
      comm.reset();  // no thread: close it on the caller's, as before
      return;
    }
  }
  queue_.push_back(std::move(comm));
  lock.unlock();
  wake_.notify_all();
}

void Closer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, and nothing left
    std::unique_ptr<Striped> comm = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    comm.reset();  // its lanes' close: flush, then the endpoints and workers
    lock.lock();
  }
}

}  // namespace loom::transport::net::ucx
