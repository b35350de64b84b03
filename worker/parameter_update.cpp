#include "worker/parameter_update.h"

#include <future>
#include <vector>

#include <ATen/ATen.h>

#include "common/flat_adamw.h"
#include "worker/ps_client.h"

namespace syncopate {
namespace {

class LocalUpdate : public ParameterUpdate {
 public:
  explicit LocalUpdate(FlatAdamW& opt) : opt_(opt) {}
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t) override {
    opt_.step(params, grads, lr);
    return 0;
  }

 private:
  FlatAdamW& opt_;
};

class PsUpdate : public ParameterUpdate {
 public:
  PsUpdate(std::unique_ptr<PsClient> c, bool overlap) : client_(std::move(c)), overlap_(overlap) {}
  ~PsUpdate() override {
    if (inflight_.valid()) inflight_.wait();
  }
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    if (!overlap_) return client_->push_pull(grads, params, step, lr);
    // The gradient was computed on `params`, whose versions are in_use_ (from the round trip
    // before last); finish the last round trip and adopt its result, then send this gradient.
    if (in_use_.empty()) in_use_ = client_->versions();  // first step: the INIT reply's values
    const std::vector<int64_t> computed_on = in_use_;
    const double stale = finish(params);
    if (!outgoing_.defined()) {
      outgoing_ = at::empty_like(grads);
      incoming_ = at::empty_like(params);
    }
    outgoing_.copy_(grads);
    incoming_.copy_(params);
    inflight_ = std::async(std::launch::async, [this, step, lr, computed_on] {
      return client_->push_pull(outgoing_, incoming_, step, lr, &computed_on);
    });
    return stale;
  }
  void synchronize(at::Tensor& params) override { finish(params); }

 private:
  double finish(at::Tensor& params) {
    if (!inflight_.valid()) return 0;
    const double stale = inflight_.get();  // rethrows a failed round trip
    params.copy_(incoming_);
    in_use_ = client_->versions();
    return stale;
  }
  std::unique_ptr<PsClient> client_;
  bool overlap_;
  at::Tensor outgoing_, incoming_;
  std::vector<int64_t> in_use_;  // parameter versions of the values in params
  std::future<double> inflight_;
};

}  // namespace

std::unique_ptr<ParameterUpdate> make_local_update(FlatAdamW& opt) { return std::make_unique<LocalUpdate>(opt); }
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> c, bool overlap) {
  return std::make_unique<PsUpdate>(std::move(c), overlap);
}

}  // namespace syncopate
