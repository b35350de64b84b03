// Hand-made parameter-server requests for tests that drive a ParameterShard (or ShardPartitions)
// without a transport.
#pragma once
#include <cstdint>

#include "server/ps_protocol.h"

namespace syncopate::test {

// An INIT of [offset, +n) from worker 0 of `workers`, weight decay 0; partition: INIT's `partition`.
inline MsgHeader init_header(int workers, int64_t n, int64_t offset = 0, int64_t partition = 0) {
  MsgHeader h;
  h.type = static_cast<int>(MsgType::kInit);
  h.worker = 0;  // a valid sender (issue 11: an INIT from no worker is refused)
  h.workers = workers;
  h.offset = offset;
  h.length = n;
  h.partition = partition;
  h.weight_decay = 0;
  return h;
}

// A PUSH_PULL of [offset, +n) by `worker` at `clock`, computed on parameter version `version`, lr 0.1.
inline MsgHeader push_header(int worker, int64_t clock, int64_t version, int64_t n, int64_t offset = 0) {
  MsgHeader h;
  h.type = static_cast<int>(MsgType::kPushPull);
  h.worker = worker;
  h.clock = clock;
  h.param_version = version;
  h.offset = offset;
  h.length = n;
  h.lr = 0.1;
  return h;
}

}  // namespace syncopate::test
