// Where a replica's gradient communication runs on a GPU, and the fences that order it against
// the computation: a communication stream per replica, an event recorded on the compute stream
// when a gradient bucket is final (in the autograd hook), the communication stream waiting on
// it, and, at the end of the step, the compute stream waiting on the communication stream. So
// reductions run while backward goes on, and the optimizer sees only reduced gradients.
// On CPU (device < 0) every call does nothing: CPU work is done when the call returns.
#pragma once
#include <memory>

namespace syncopate {

class CommStream {
 public:
  class Fence {
   public:
    virtual ~Fence() = default;
  };
  virtual ~CommStream() = default;
  // A point on the calling thread's current stream: the work queued there so far. Null on CPU.
  virtual std::shared_ptr<Fence> record_current() = 0;
  // Makes the communication stream (and its device) current on the calling thread: called once
  // by the communication thread, so that everything it queues (NCCL fences, copies) goes there.
  virtual void enter() = 0;
  // Work queued on the communication stream from now on waits for `f`.
  virtual void wait(const Fence& f) = 0;
  // The calling thread's current stream waits for everything queued on the communication stream.
  virtual void join_into_current() = 0;
};

// device < 0: the CPU object that does nothing; otherwise a stream on CUDA device `device`
// (an error naming the fix in a build without CUDA).
std::unique_ptr<CommStream> make_comm_stream(int device);

}  // namespace syncopate
