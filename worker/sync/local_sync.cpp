// LocalSync: one replica alone ("none" with one replica). Nothing to average; the update is
// the local AdamW step.
#include <ATen/ATen.h>

#include "model/flat_parameters.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class LocalSync : public GradientSync {
 public:
  LocalSync(const SyncSetup& s, FlatParameters& flat)
      : GradientSync(0, 1), clip_(s.optim.grad_clip), skip_(s.skip_grad_norm),
        opt_(s.optim, flat.numel(), flat.decay_ranges(), flat.params.options()) {}
  int rank() const override { return 0; }
  int world() const override { return 1; }
  int replicas_per_step() const override { return 1; }
  void start(at::Tensor&, int64_t) override {}
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t) override {
    StepSync r;
    r.grad_norm = clip_grad_norm(grads, clip_);
    r.skipped = skip_update(r.grad_norm, skip_);
    if (!r.skipped) opt_.step(params, grads, lr);
    return r;
  }
  double average(double x, bool*) override { return x; }
  void check_identical(const at::Tensor&, int64_t) override {}
  std::function<void(at::Tensor&)> job_sum() override { return [](at::Tensor&) {}; }  // one replica: itself
  FlatAdamW* optimizer() override { return &opt_; }
  SyncCounters counters() const override { return {}; }

 private:
  double clip_, skip_;
  FlatAdamW opt_;
};

}  // namespace

std::unique_ptr<GradientSync> make_local_sync(const SyncSetup& s, FlatParameters& flat) {
  return std::make_unique<LocalSync>(s, flat);
}

}  // namespace syncopate
