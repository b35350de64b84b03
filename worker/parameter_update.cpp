#include "worker/parameter_update.h"

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
  explicit PsUpdate(std::unique_ptr<PsClient> c) : client_(std::move(c)) {}
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    return client_->push_pull(grads, params, step, lr);
  }

 private:
  std::unique_ptr<PsClient> client_;
};

}  // namespace

std::unique_ptr<ParameterUpdate> make_local_update(FlatAdamW& opt) { return std::make_unique<LocalUpdate>(opt); }
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> c) { return std::make_unique<PsUpdate>(std::move(c)); }

}  // namespace syncopate
