// Worker side of the `ps` mode: one ZeroMQ DEALER per parameter-server shard. The flat parameter
// vector is split into contiguous, size-balanced ranges, range k on server k (a large tensor such
// as the embedding spreads over several servers). Pushes go to all shards at once, then the
// replies are gathered, so the shards work in parallel.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/flat_adamw.h"

namespace syncopate {

// Every tensor passed in lives in host memory (a GPU replica stages through host buffers; see
// parameter_update.cpp): frames are sent from, and replies copied into, its memory directly.
class PsClient {
 public:
  // endpoints: tcp://IP:PORT of each shard; worker: this worker's id of `workers`.
  // curve_server_key: the servers' CURVE public key (Z85) to encrypt and authenticate every
  // connection; "" = plain TCP.
  PsClient(const std::vector<std::string>& endpoints, const std::string& token, int worker, int workers,
           double timeout_s, const std::string& curve_server_key = "");
  ~PsClient();

  // Sends INIT (range, AdamW settings, initial values, decay ranges, the step this worker starts
  // at) to every shard and loads the shards' current values into params (the first worker's INIT
  // wins; later joiners and restarted workers get the latest).
  void init(at::Tensor& params, const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWConfig& opt,
            int64_t start_step = 0);
  // Pushes the gradient (computed at `clock` on the last pulled parameters) with learning rate lr
  // and replaces params with the shards' reply. Returns the mean staleness of this update.
  // computed_on: per-shard parameter versions the gradient was computed on (default: the versions
  // of the last replies, right when the worker waits for each round trip).
  double push_pull(const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr,
                   const std::vector<int64_t>* computed_on = nullptr);
  // The same in two halves, so that a shard's push can leave as soon as its range of the gradient
  // is final (during backward): push_shard sends shard k's range of grads without waiting (grads
  // must stay untouched until gather returns); gather pushes the shards not pushed yet, then
  // waits for every reply and writes params. Thread-compatible: one caller at a time.
  // computed_on: the shard's parameter version the gradient was computed on (-1: the last reply's).
  void push_shard(int k, const at::Tensor& grads, int64_t clock, double lr, int64_t computed_on = -1);
  double gather(const at::Tensor& grads, at::Tensor& params, int64_t clock, double lr);
  // Shard boundaries in the flat vector: shard k holds [b[k], b[k+1]) (after init()).
  std::vector<int64_t> shard_bounds() const;
  // The boundaries init() uses: n elements over `shards` contiguous, size-balanced ranges.
  static std::vector<int64_t> even_bounds(int64_t n, int shards);
  // Parameter versions of the last replies, per shard.
  std::vector<int64_t> versions() const;
  // The STATS JSON of shard k.
  std::string stats(int k);
  // Asks every shard to exit.
  void shutdown_servers();

  static std::vector<std::string> parse_endpoints(const std::string& comma_separated);

 private:
  static void require_host(const at::Tensor& t, const char* what);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
