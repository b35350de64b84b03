#include "worker/sync/elastic_ring.h"

#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/rendezvous.h"
#include "common/comm/rendezvous_session.h"
#include "common/log.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {

ElasticRing::ElasticRing(std::shared_ptr<RendezvousSession> session, const DistConfig& dist, double latency_s,
                         Relink relink)
    : session_(std::move(session)), dist_(dist), latency_s_(latency_s), relink_(std::move(relink)) {
  SYN_CHECK(session_, "the elastic ring has no session with the rendezvous service", "this is a bug");
}

ElasticRing::~ElasticRing() { ring_.reset(); }  // (the owner dropped its collectives first)

int ElasticRing::node() const { return session_->node(); }
bool ElasticRing::pending() const { return session_->pending(); }

float count_members(bool counts, int device, const std::function<void(at::Tensor&)>& sum_exact) {
  at::Tensor n = at::full({1}, counts ? 1.f : 0.f, replica_options(device));
  sum_exact(n);
  return n.cpu().item<float>();
}

void ElasticRing::lost(int64_t step, const std::string& why) {
  if (!broken_)
    log::warn("[dist] node {}: the ring broke at step {} ({}); it re-forms through the rendezvous service",
              session_->node(), step + 1, why);
  broken_ = true;
  if (ring_) ring_->shutdown();  // the neighbours fail at once too, and so on around the ring
}

void ElasticRing::drop() {
  if (ring_) ring_->shutdown();
  relink_(nullptr);  // the collectives first: they hold the links
  ring_.reset();
}

void ElasticRing::leave() {
  session_->leave();
  left_ = true;
  drop();
}

void ElasticRing::done() { session_->done(); }

JobPosition ElasticRing::reform(int64_t key, int64_t step, const std::function<JobPosition(const Epoch&)>& take) {
  drop();
  int unlinked = -1;  // the next node of a formation that broke off because this node could not connect to it
  for (;;) {
    const Epoch e = session_->regroup(key, dist_.min_nodes_wait_s, std::exchange(unlinked, -1));
    bool next_unreachable = false;
    try {
      ring_ = link(e, &next_unreachable);
      relink_(ring_);
      const JobPosition p = take(e);
      if (formed_ || e.members.size() > 1 || p.step > 0)
        log::info("[dist] ring epoch {}: node(s) {} (this node {} of {}); state from node {} at step {}{}", e.number,
                  e.nodes(), e.index, e.members.size(), e.root, p.step,
                  p.step < step ? fmt::format(" (this node's step {} abandoned)", step + 1) : "");
      formed_ = true;
      broken_ = false;
      return p;
    } catch (const Error& err) {
      log::warn("[dist] node {}: ring epoch {} broke off while it formed ({}); asking again", session_->node(), e.number,
                err.what());
      if (next_unreachable && e.members.size() > 1)
        unlinked = e.members[static_cast<size_t>((e.index + 1) % static_cast<int>(e.members.size()))].node;
      drop();
    }
  }
}

std::shared_ptr<Ring> ElasticRing::link(const Epoch& e, bool* next_unreachable) {
  auto ring = std::make_shared<Ring>();
  const int n = static_cast<int>(e.members.size()), i = e.index;
  ring->rank = i;
  ring->world = n;
  if (n == 1) return ring;
  const EpochMember &next = e.members[static_cast<size_t>((i + 1) % n)], &prev = e.members[static_cast<size_t>((i + n - 1) % n)];
  RingLinksPlan p;
  p.self = session_->node(), p.next = next.node, p.prev = prev.node;
  p.next_host = next.host, p.next_port = next.port;
  p.next_name = fmt::format("node {} at {}:{}", next.node, next.host, next.port);
  p.prev_name = fmt::format("node {} at {}:{}", prev.node, prev.host, prev.port);
  p.epoch = e.number;
  p.streams = static_cast<int>(dist_.streams);
  p.timeout_s = dist_.timeout_s;
  p.latency_s = latency_s_;
  p.next_unreachable = next_unreachable;
  connect_ring_links(*ring, session_->io(), session_->listener(), session_->key(), p);
  return ring;
}

}  // namespace syncopate
