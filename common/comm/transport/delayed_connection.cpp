#include "common/comm/transport/delayed_connection.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "common/check.h"

namespace syncopate {

using Clock = std::chrono::steady_clock;

struct DelayedConnection::State {
  struct Chunk {
    std::vector<char> bytes;
    size_t taken = 0;     // bytes of it already read by the consumer
    Clock::time_point due;  // when it becomes readable: arrival + delay
  };
  Clock::duration delay;
  double timeout_s;
  size_t max_buffered;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Chunk> queue;
  size_t buffered = 0;
  std::exception_ptr failure;  // what ended the wrapped connection (after the queued bytes)
  bool stopping = false, shut = false;
  std::thread reader;
};

DelayedConnection::DelayedConnection(std::unique_ptr<Connection> inner, double delay_s, double timeout_s,
                                     size_t max_buffered)
    : inner_(std::move(inner)), state_(std::make_unique<State>()) {
  SYN_CHECK(delay_s >= 0, fmt::format("a delay line of {} s", delay_s), "a propagation delay is 0 or more seconds");
  State& S = *state_;
  S.delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s));
  S.timeout_s = timeout_s;
  S.max_buffered = std::max<size_t>(max_buffered, 1);
  S.reader = std::thread([this] {
    State& S = *state_;
    std::vector<char> buf(256 << 10);
    for (;;) {
      {
        std::unique_lock<std::mutex> l(S.mu);
        S.cv.wait(l, [&] { return S.stopping || S.buffered < S.max_buffered; });
        if (S.stopping) return;
      }
      size_t k = 0;
      try {
        k = inner_->recv_some(buf.data(), buf.size(), 0.05);  // short waits: notice stopping
      } catch (...) {
        std::lock_guard<std::mutex> l(S.mu);
        S.failure = std::current_exception();
        S.cv.notify_all();
        return;
      }
      if (k == 0) continue;
      const auto arrived = Clock::now();
      std::lock_guard<std::mutex> l(S.mu);
      S.queue.push_back({std::vector<char>(buf.data(), buf.data() + k), 0, arrived + S.delay});
      S.buffered += k;
      S.cv.notify_all();
    }
  });
}

DelayedConnection::~DelayedConnection() {
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->stopping = true;
    state_->cv.notify_all();
  }
  state_->reader.join();
}

void DelayedConnection::send(const void* data, size_t n) { inner_->send(data, n); }
std::string DelayedConnection::peer() const { return inner_->peer(); }

void DelayedConnection::shutdown() {
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->shut = true;
    state_->cv.notify_all();
  }
  inner_->shutdown();
}

size_t DelayedConnection::recv_some(void* data, size_t max, double wait_s) {
  State& S = *state_;
  char* p = static_cast<char*>(data);
  std::unique_lock<std::mutex> l(S.mu);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  for (;;) {
    SYN_CHECK(!S.shut, fmt::format("receiving from {} failed: the connection was shut down", inner_->peer()),
              "this node is stopping after a failure elsewhere; see the first error in its log");
    const auto now = Clock::now();
    if (!S.queue.empty() && S.queue.front().due <= now) break;
    if (S.queue.empty() && S.failure) std::rethrow_exception(S.failure);
    if (now >= deadline) return 0;
    const auto until = S.queue.empty() ? deadline : std::min(deadline, S.queue.front().due);
    S.cv.wait_until(l, until);
  }
  size_t got = 0;
  const auto now = Clock::now();
  while (got < max && !S.queue.empty() && S.queue.front().due <= now) {
    auto& c = S.queue.front();
    const size_t k = std::min(max - got, c.bytes.size() - c.taken);
    std::memcpy(p + got, c.bytes.data() + c.taken, k);
    c.taken += k;
    got += k;
    if (c.taken == c.bytes.size()) {
      S.buffered -= c.bytes.size();
      S.queue.pop_front();
    }
  }
  S.cv.notify_all();  // room for the reader
  return got;
}

void DelayedConnection::recv(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const size_t k = recv_some(p, n, state_->timeout_s);
    SYN_CHECK(k > 0,
              fmt::format("receiving from {} failed: nothing arrived for {} s", inner_->peer(), state_->timeout_s),
              "the peer is hung or too slow; check its log or raise dist.timeout_s");
    p += k;
    n -= k;
  }
}

}  // namespace syncopate
