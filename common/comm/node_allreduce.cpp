#include "common/comm/node_allreduce.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "common/check.h"
#include "common/comm/local_group.h"
#include "common/trace.h"

namespace syncopate {

// The ring thread of a pipelined NodeAllreduce: it rings the queued slices in order, on host
// memory, while the caller's thread does the in-node collectives and the device copies (every
// call on the local group stays on that one thread, in one order on every replica).
struct NodeAllreduce::Pipeline {
  struct Job {
    at::Tensor whole;  // the buffer being summed (on the replica's device)
    at::Tensor slice;  // this replica's slice of it
    at::Tensor host;   // the slice in host memory (the slice itself on CPU)
    RingAllreduceOptions opt;
    bool done = false;  // the ring is done with it (or failed: see error)
  };
  explicit Pipeline(RingAllreducer& lane) : lane(lane), thread([this] { loop(); }) {}
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void push(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> l(mu);
    todo.push_back(std::move(job));
    cv.notify_all();
  }
  // Returns once the ring is done with `job`; rethrows the ring's first failure.
  void wait(const Job& job) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return job.done; });
    if (error) std::rethrow_exception(error);
  }
  void rethrow_failure() {
    std::lock_guard<std::mutex> l(mu);
    if (error) std::rethrow_exception(error);
  }
  void loop() {
    Tracer::global().name_thread("ring (nodes)");
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return stop || !todo.empty(); });
      if (stop) return;  // what is still queued is abandoned: its owner is gone
      std::shared_ptr<Job> job = todo.front();
      todo.pop_front();
      const bool failed = static_cast<bool>(error);  // after a failure the ring is unusable: skip
      l.unlock();
      std::exception_ptr err;
      if (!failed) {
        try {
          TraceSpan span("ring all-reduce (nodes)", "comm");
          lane.sum(job->host.data_ptr<float>(), static_cast<size_t>(job->host.numel()), job->opt);
        } catch (...) {
          err = std::current_exception();
        }
      }
      l.lock();
      if (err && !error) error = err;
      job->done = true;
      cv.notify_all();
    }
  }

  RingAllreducer& lane;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> todo;  // for the ring thread, in submission order
  bool stop = false;
  std::exception_ptr error;
  // The caller's side (its thread only): the buffer waiting for its all-gather, and two staging
  // buffers used in turn (job k's is free again once job k was all-gathered, before job k+2).
  std::shared_ptr<Job> in_node;
  HostStaging staging[2];
  int next_slot = 0;
  std::thread thread;  // last: started once every member above exists
};

NodeAllreduce::NodeAllreduce(LocalGroup* group, int local_rank, RingAllreducer* lane, int nodes, Hierarchy h)
    : group_(group), local_rank_(local_rank), lane_(lane), nodes_(nodes), hierarchy_(h) {}

NodeAllreduce::~NodeAllreduce() = default;

at::Tensor NodeAllreduce::own_slice(const at::Tensor& t) const {
  const int64_t n = t.numel(), L = group_->size();
  return t.slice(0, Sharding::begin(n, L, local_rank_), Sharding::begin(n, L, local_rank_ + 1));
}
// The inter-node ring on host memory: GPU slices travel through the staging buffer (pinned,
// reused by every later call: one per bucket per step).
void NodeAllreduce::ring_sum(RingAllreducer& lane, at::Tensor t, const RingAllreduceOptions& opt) const {
  // The in-node collective queued before: waited for bounded and abortable (an aborted one never
  // reaches the ring half-reduced), then the copy, which waits for nothing else.
  if (group_ && !t.is_cpu()) group_->wait_device(local_rank_, "the in-node reduction");
  at::Tensor host = staging_.to_host(t);
  TraceSpan span("ring all-reduce (nodes)", "comm");
  lane.sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()), opt);
  HostStaging::to_device(t, host);
}

template <class F>
void NodeAllreduce::guarded(F&& f) const {
  SYN_CHECK(!broken_, "an earlier all-reduce of this replica failed midway: its in-node collectives are out of step "
                      "with the other replicas'", "see the first error above");
  try {
    f();
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void NodeAllreduce::sum(at::Tensor t, const RingAllreduceOptions& opt) const {
  guarded([&] { sum_unguarded(t, opt); });
}

void NodeAllreduce::sum_unguarded(at::Tensor t, const RingAllreduceOptions& opt) const {
  SYN_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
            "all-reduce needs a contiguous 1-D float32 buffer", "this is a bug");
  if (!group_ || group_->size() == 1) {
    if (nodes_ > 1) ring_sum(*lane_, t, opt);
    return;
  }
  if (nodes_ == 1) {  // one node: the local group is everything
    TraceSpan span("all-reduce (in node)", "comm");
    group_->all_reduce_sum(local_rank_, t);
    return;
  }
  if (hierarchy_ == Hierarchy::kRoot) {
    group_->reduce_sum(local_rank_, t, 0);
    if (local_rank_ == 0) ring_sum(*lane_, t, opt);
    group_->broadcast(local_rank_, t, 0);
    return;
  }
  {
    TraceSpan span("reduce-scatter (in node)", "comm");
    group_->reduce_scatter_sum(local_rank_, t);
  }
  ring_sum(*lane_, own_slice(t), opt);
  TraceSpan span("all-gather (in node)", "comm");
  group_->all_gather(local_rank_, t);
}

void NodeAllreduce::submit(at::Tensor t, const RingAllreduceOptions& opt) {
  if (!(group_ && group_->size() > 1 && nodes_ > 1 && hierarchy_ == Hierarchy::kSliced && lane_)) return sum(t, opt);
  guarded([&] { submit_unguarded(t, opt); });
}

void NodeAllreduce::submit_unguarded(at::Tensor t, const RingAllreduceOptions& opt) {
  if (!pipe_) pipe_ = std::make_unique<Pipeline>(*lane_);  // the ring thread, at the first pipelined sum
  SYN_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
            "all-reduce needs a contiguous 1-D float32 buffer", "this is a bug");
  pipe_->rethrow_failure();
  {
    TraceSpan span("reduce-scatter (in node)", "comm");
    group_->reduce_scatter_sum(local_rank_, t);
  }
  auto job = std::make_shared<Pipeline::Job>();
  job->whole = t;
  job->slice = own_slice(t);
  job->opt = opt;
  if (!t.is_cpu()) group_->wait_device(local_rank_, "a reduce-scatter");  // bounded, before the copy waits on it
  job->host = pipe_->staging[pipe_->next_slot].to_host(job->slice);
  pipe_->next_slot ^= 1;
  pipe_->push(job);
  // The previous buffer's all-gather, now that this one's reduce-scatter is issued: the ring
  // goes on with this buffer meanwhile.
  if (auto prev = std::exchange(pipe_->in_node, job)) {
    pipe_->wait(*prev);
    HostStaging::to_device(prev->slice, prev->host);
    TraceSpan span("all-gather (in node)", "comm");
    group_->all_gather(local_rank_, prev->whole);
  }
}

void NodeAllreduce::drain() {
  if (pipe_) guarded([&] { drain_unguarded(); });
}

void NodeAllreduce::drain_unguarded() {
  std::shared_ptr<Pipeline::Job> last = std::exchange(pipe_->in_node, nullptr);
  if (!last) return pipe_->rethrow_failure();
  pipe_->wait(*last);
  if (!last->whole.is_cpu()) group_->wait_device(local_rank_, "the previous all-gather");  // before the copy waits on it
  HostStaging::to_device(last->slice, last->host);
  {
    TraceSpan span("all-gather (in node)", "comm");
    group_->all_gather(local_rank_, last->whole);
  }
  if (!last->whole.is_cpu()) group_->wait_device(local_rank_, "the last all-gather");  // the step ends bounded
}

Hierarchy parse_hierarchy(const std::string& name) {
  if (name == "sliced") return Hierarchy::kSliced;
  if (name == "root") return Hierarchy::kRoot;
  SYN_FAIL("dist.hierarchy='" + name + "' is not a hierarchy", "use sliced or root");
}

}  // namespace syncopate
