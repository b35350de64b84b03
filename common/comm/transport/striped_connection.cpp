#include "common/comm/transport/striped_connection.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "common/check.h"

namespace syncopate {

// Threads that each run one stripe of the current message on their link; run() does stripe 0 on
// the caller's thread and returns when all stripes are done (rethrowing the first failure).
struct StripedConnection::Lanes {
  explicit Lanes(size_t extra) : jobs(extra) {
    for (size_t i = 0; i < extra; ++i) threads.emplace_back([this, i] { loop(i); });
  }
  ~Lanes() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
  void run(const std::vector<std::function<void()>>& stripes) {  // stripes[0] runs here
    {
      std::lock_guard<std::mutex> l(mu);
      for (size_t i = 1; i < stripes.size(); ++i) jobs[i - 1] = stripes[i];
      busy = stripes.size() - 1;
      error = nullptr;
      ++generation;
    }
    cv.notify_all();
    std::exception_ptr mine;
    try {
      stripes[0]();
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> l(mu);
    done_cv.wait(l, [&] { return busy == 0; });
    if (mine) std::rethrow_exception(mine);
    if (error) std::rethrow_exception(error);
  }
  void loop(size_t i) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return stop || (generation != seen && jobs[i]); });
      if (stop) return;
      seen = generation;
      auto job = std::move(jobs[i]);
      jobs[i] = nullptr;
      l.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      l.lock();
      if (err && !error) error = err;
      if (--busy == 0) done_cv.notify_all();
    }
  }
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::vector<std::function<void()>> jobs;
  std::vector<std::thread> threads;
  size_t busy = 0;
  uint64_t generation = 0;
  bool stop = false;
  std::exception_ptr error;
};

StripedConnection::StripedConnection(std::vector<std::unique_ptr<Connection>> links, size_t min_stripe)
    : links_(std::move(links)), min_stripe_(std::max<size_t>(min_stripe, 1)) {
  SYN_CHECK(!links_.empty(), "a striped connection needs at least one link", "");
  send_lanes_ = std::make_unique<Lanes>(links_.size() - 1);
  recv_lanes_ = std::make_unique<Lanes>(links_.size() - 1);
}

StripedConnection::~StripedConnection() = default;

namespace {
// Stripe i of a message of n bytes over k links: [begin, end). The same on both ends.
std::pair<size_t, size_t> stripe(size_t n, size_t k, size_t i) { return {n * i / k, n * (i + 1) / k}; }
}  // namespace

void StripedConnection::shutdown() {
  for (auto& l : links_) l->shutdown();
}

void StripedConnection::send(const void* data, size_t n) {
  const size_t k = std::min(links_.size(), std::max<size_t>(1, n / min_stripe_));
  if (k == 1) return links_[0]->send(data, n);
  std::vector<std::function<void()>> stripes;
  for (size_t i = 0; i < k; ++i) {
    const auto [b, e] = stripe(n, k, i);
    stripes.push_back([this, i, p = static_cast<const char*>(data) + b, len = e - b] { links_[i]->send(p, len); });
  }
  send_lanes_->run(stripes);
}

void StripedConnection::recv(void* data, size_t n) {
  const size_t k = std::min(links_.size(), std::max<size_t>(1, n / min_stripe_));
  if (k == 1) return links_[0]->recv(data, n);
  std::vector<std::function<void()>> stripes;
  for (size_t i = 0; i < k; ++i) {
    const auto [b, e] = stripe(n, k, i);
    stripes.push_back([this, i, p = static_cast<char*>(data) + b, len = e - b] { links_[i]->recv(p, len); });
  }
  recv_lanes_->run(stripes);
}

std::string StripedConnection::peer() const {
  return links_.size() == 1 ? links_[0]->peer() : fmt::format("{} ({} streams)", links_[0]->peer(), links_.size());
}

}  // namespace syncopate
