#include "server/zmq_delay_line.h"

#include <csignal>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <vector>

#include <fmt/format.h>
#include <zmq_addon.hpp>

#include "common/check.h"

namespace syncopate {

using Clock = std::chrono::steady_clock;

struct ZmqDelayLine::State {
  struct Held {
    Clock::time_point due;
    std::vector<zmq::message_t> frames;
  };
  zmq::socket_t& outer;
  zmq::socket_t far, near;  // far: the thread's end of the PAIR; near: the loop's
  Clock::duration delay;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> outbound{0};  // messages taken from the loop and not yet sent to the workers
  std::atomic<int64_t> rounds{0};    // poll rounds done (a round after a request has drained what came before it)
  mutable std::mutex mu;
  std::exception_ptr failure;
  std::thread thread;

  State(zmq::context_t& ctx, zmq::socket_t& o, double delay_s)
      : outer(o), far(ctx, zmq::socket_type::pair), near(ctx, zmq::socket_type::pair),
        delay(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s))) {}

  // Takes every message waiting on `from` (without blocking), stamping each due = now + delay.
  void drain(zmq::socket_t& from, std::deque<Held>& into) {
    for (;;) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(from, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
      into.push_back({Clock::now() + delay, std::move(frames)});
      if (&from == &far) ++outbound;
    }
  }
  // Sends the messages of `q` that are due, in order; returns how many.
  static int64_t release(std::deque<Held>& q, zmq::socket_t& to) {
    const auto now = Clock::now();
    int64_t sent = 0;
    while (!q.empty() && q.front().due <= now) {
      zmq::send_multipart(to, q.front().frames);
      q.pop_front();
      ++sent;
    }
    return sent;
  }

  void run() {
    std::deque<Held> in, out;  // toward the loop, toward the workers
    while (!stopping.load()) {
      auto next = Clock::now() + std::chrono::milliseconds(50);  // wake to notice stopping
      if (!in.empty()) next = std::min(next, in.front().due);
      if (!out.empty()) next = std::min(next, out.front().due);
      // Rounded up: a wait truncated to 0 ms would spin until the next message is due.
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
      zmq::pollitem_t items[] = {{outer.handle(), 0, ZMQ_POLLIN, 0}, {far.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::max(wait, std::chrono::milliseconds(0)));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;  // a signal (the loop handles SIGTERM): nothing lost
        throw;
      }
      if (items[0].revents & ZMQ_POLLIN) drain(outer, in);
      if (items[1].revents & ZMQ_POLLIN) drain(far, out);
      release(in, far);
      outbound -= release(out, outer);
      ++rounds;
    }
  }
};

ZmqDelayLine::ZmqDelayLine(zmq::context_t& ctx, zmq::socket_t& outer, double delay_s)
    : state_(std::make_unique<State>(ctx, outer, delay_s)) {
  SYN_CHECK(delay_s >= 0, fmt::format("a delay line of {} s", delay_s), "a propagation delay is 0 or more seconds");
  State& S = *state_;
  for (auto* s : {&S.far, &S.near}) {  // unbounded, as the ROUTER's replies: what is held is bounded by the requests
    s->set(zmq::sockopt::sndhwm, 0);
    s->set(zmq::sockopt::rcvhwm, 0);
    s->set(zmq::sockopt::linger, 0);
  }
  const std::string ep = fmt::format("inproc://syncopate-delay-line-{}", static_cast<const void*>(this));
  S.far.bind(ep);
  S.near.connect(ep);
  // The thread takes no SIGTERM / SIGINT (as libzmq's own threads): the loop's thread handles them.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  S.thread = std::thread([&S] {
    try {
      S.run();
    } catch (...) {
      std::lock_guard<std::mutex> l(S.mu);
      S.failure = std::current_exception();
    }
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void ZmqDelayLine::flush(double max_wait_s) {
  State& S = *state_;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(max_wait_s));
  // What the loop sent before this call is drained by the thread's next full round: wait for two
  // rounds (one may have been under way), then until nothing taken is still held.
  const int64_t r0 = S.rounds.load();
  while ((S.rounds.load() < r0 + 2 || S.outbound.load() > 0) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  S.stopping = true;
  S.thread.join();
  S.outer.set(zmq::sockopt::linger, 1000);  // ZeroMQ's own queue: let the last replies out
}

ZmqDelayLine::~ZmqDelayLine() {
  state_->stopping = true;
  if (state_->thread.joinable()) state_->thread.join();
}

zmq::socket_t& ZmqDelayLine::inner() { return state_->near; }

void ZmqDelayLine::check() const {
  std::lock_guard<std::mutex> l(state_->mu);
  if (state_->failure) std::rethrow_exception(state_->failure);
}

}  // namespace syncopate
