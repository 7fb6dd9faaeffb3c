#include "transports/net/ucx/closer.h"

#include <utility>

namespace loom::transport::net::ucx {

Closer::~Closer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();  // run() returns only once the queue is empty
}

void Closer::close(std::unique_ptr<Striped> comm) noexcept {
  if (!comm) return;
  try {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back(std::move(comm));  // leaves `comm` as it was if it throws
  } catch (...) {
    comm.reset();  // no thread or no room: closed here, on the caller's thread, as before
    return;
  }
  wake_.notify_all();
}

void Closer::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return queue_.empty() && !closing_; });
}

void Closer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, and nothing left
    std::unique_ptr<Striped> comm = std::move(queue_.front());
    queue_.pop_front();
    closing_ = true;
    lock.unlock();
    comm.reset();  // its lanes' close: flush, then the endpoints and workers
    lock.lock();
    closing_ = false;
    done_.notify_all();
  }
}

}  // namespace loom::transport::net::ucx
