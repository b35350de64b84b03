#include "server/zmq_delay_line.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
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
    }
  }
  // Sends the messages of `q` that are due, in order.
  static void release(std::deque<Held>& q, zmq::socket_t& to) {
    const auto now = Clock::now();
    while (!q.empty() && q.front().due <= now) {
      zmq::send_multipart(to, q.front().frames);
      q.pop_front();
    }
  }

  void run() {
    std::deque<Held> in, out;  // toward the loop, toward the workers
    while (!stopping.load()) {
      auto next = Clock::now() + std::chrono::milliseconds(50);  // wake to notice stopping
      if (!in.empty()) next = std::min(next, in.front().due);
      if (!out.empty()) next = std::min(next, out.front().due);
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
      zmq::pollitem_t items[] = {{outer.handle(), 0, ZMQ_POLLIN, 0}, {far.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::max(wait, std::chrono::milliseconds(0)));
      if (items[0].revents & ZMQ_POLLIN) drain(outer, in);
      if (items[1].revents & ZMQ_POLLIN) drain(far, out);
      release(in, far);
      release(out, outer);
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
  S.thread = std::thread([&S] {
    try {
      S.run();
    } catch (...) {
      std::lock_guard<std::mutex> l(S.mu);
      S.failure = std::current_exception();
    }
  });
}

ZmqDelayLine::~ZmqDelayLine() {
  state_->stopping = true;
  state_->thread.join();
}

zmq::socket_t& ZmqDelayLine::inner() { return state_->near; }

void ZmqDelayLine::check() const {
  std::lock_guard<std::mutex> l(state_->mu);
  if (state_->failure) std::rethrow_exception(state_->failure);
}

}  // namespace syncopate
