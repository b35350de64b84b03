#include "common/comm/transport/memory_connection.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "common/check.h"

namespace syncopate {
namespace {

struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> ring;
  size_t head = 0, size = 0;  // read position, bytes buffered
  bool closed = false;
  explicit Channel(size_t cap) : ring(cap) {}
};

class MemoryEnd : public Connection {
 public:
  MemoryEnd(std::shared_ptr<Channel> ch, bool sender, std::string name)
      : ch_(std::move(ch)), sender_(sender), name_(std::move(name)) {}
  ~MemoryEnd() override { shutdown(); }
  void shutdown() override {
    std::lock_guard<std::mutex> l(ch_->mu);
    ch_->closed = true;
    ch_->cv.notify_all();
  }
  void send(const void* data, size_t n) override {
    SYN_CHECK(sender_, "receive-only end of a memory channel used to send", "this is a bug");
    const char* p = static_cast<const char*>(data);
    std::unique_lock<std::mutex> l(ch_->mu);
    const size_t cap = ch_->ring.size();
    while (n > 0) {
      ch_->cv.wait(l, [&] { return ch_->size < cap || ch_->closed; });
      SYN_CHECK(!ch_->closed, fmt::format("{}: the receiver is gone", name_), "the peer thread exited early");
      const size_t tail = (ch_->head + ch_->size) % cap;
      const size_t k = std::min({n, cap - ch_->size, cap - tail});
      std::memcpy(ch_->ring.data() + tail, p, k);
      ch_->size += k;
      p += k;
      n -= k;
      ch_->cv.notify_all();
    }
  }
  void recv(void* data, size_t n) override {
    SYN_CHECK(!sender_, "send-only end of a memory channel used to receive", "this is a bug");
    char* p = static_cast<char*>(data);
    std::unique_lock<std::mutex> l(ch_->mu);
    const size_t cap = ch_->ring.size();
    while (n > 0) {
      ch_->cv.wait(l, [&] { return ch_->size > 0 || ch_->closed; });
      SYN_CHECK(ch_->size > 0, fmt::format("{}: the sender closed the channel", name_), "the peer thread exited early");
      const size_t k = std::min({n, ch_->size, cap - ch_->head});
      std::memcpy(p, ch_->ring.data() + ch_->head, k);
      ch_->head = (ch_->head + k) % cap;
      ch_->size -= k;
      p += k;
      n -= k;
      ch_->cv.notify_all();
    }
  }
  size_t recv_some(void* data, size_t max, double wait_s) override {
    SYN_CHECK(!sender_, "send-only end of a memory channel used to receive", "this is a bug");
    std::unique_lock<std::mutex> l(ch_->mu);
    if (!ch_->cv.wait_for(l, std::chrono::duration<double>(wait_s), [&] { return ch_->size > 0 || ch_->closed; }))
      return 0;
    SYN_CHECK(ch_->size > 0, fmt::format("{}: the sender closed the channel", name_), "the peer thread exited early");
    const size_t k = std::min({max, ch_->size, ch_->ring.size() - ch_->head});
    std::memcpy(data, ch_->ring.data() + ch_->head, k);
    ch_->head = (ch_->head + k) % ch_->ring.size();
    ch_->size -= k;
    ch_->cv.notify_all();
    return k;
  }
  std::string peer() const override { return name_; }

 private:
  std::shared_ptr<Channel> ch_;
  bool sender_;
  std::string name_;
};

}  // namespace

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> memory_channel(size_t capacity,
                                                                                   const std::string& name) {
  auto ch = std::make_shared<Channel>(std::max<size_t>(capacity, 1));
  return {std::make_unique<MemoryEnd>(ch, true, name), std::make_unique<MemoryEnd>(ch, false, name)};
}

}  // namespace syncopate
