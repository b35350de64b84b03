// Parameter-server wire protocol (docs/PROTOCOL.md). A message is a ZeroMQ multipart message:
// frame 0 a msgpack map (MsgHeader, at most kMaxHeaderBytes), then raw little-endian data
// frames (float32 values, or int64 pairs for INIT's weight-decay ranges), sent without copying.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <msgpack.hpp>

namespace syncopate {

constexpr uint32_t kPsProtocolVersion = 12;  // 2: INIT's update rule (local SGD / DiLoCo) and wire format;
                                             // 3: INIT's job layout, FINISH; 4: partitions (INIT's `partition`,
                                             // requests and replies name their partition by offset and length);
                                             // 5: INIT's `overlap` (refused with BSP backup workers);
                                             // 6: elastic membership (INIT's `elastic` and `join`, `samples`,
                                             // replies' `data`); 7: FINISH's `data` = kFinishStillReading;
                                             // 8: INIT's `moments` and `adam_steps` (a switch into ps mode);
                                             // 9: replies' `round` (BSP: where the job's clocks stand);
                                             // 10: `pushed` (a joiner's grant replaced only where it was used);
                                             // 11: replies to INIT join = 2 carry join = 2 (a late one is never
                                             // taken for a push's), a restarted member's held push defers its join;
                                             // 12: INIT's outer_delay 0 (elastic delayed Nesterov: N = the live
                                             // members at each arrival)
constexpr int64_t kMaxPartitionsPerServer = 4096;  // a server holds at most this many partitions (INIT `partition`)
constexpr size_t kMaxHeaderBytes = 4096;          // requests (what a server decodes: tight)
constexpr size_t kMaxReplyHeaderBytes = 1 << 20;  // replies
// The largest message a server takes (ZMQ_MAXMSGSIZE; a larger one makes ZeroMQ drop the
// connection): a part of at most kMaxMessageBytes / 4 float32 values. Workers refuse a layout with
// a longer part (PsClient::part_bounds), servers an INIT of one (ParameterShard::check_init).
constexpr int64_t kMaxMessageBytes = int64_t{1} << 34;
// A parameter version on the wire (replies' param_version, what pushes name, DC-ASGD's keys): the
// shard's restore epoch (restores so far) above bit kVersionEpochShift, its update count below, so
// it rises across restarts where the count repeats the numbers a crash lost.
constexpr int kVersionEpochShift = 40;
constexpr int64_t wire_version(int64_t epoch, int64_t updates) { return (epoch << kVersionEpochShift) | updates; }
constexpr int64_t updates_of(int64_t wire) { return wire & ((int64_t{1} << kVersionEpochShift) - 1); }

enum class MsgType : int {
  kInit = 1,      // worker -> server: shard range, optimizer settings, initial values (+ decay ranges)
  kPushPull = 2,  // worker -> server: gradient of the range; reply: parameters after the update
  kPull = 3,      // worker -> server: reply carries the current parameters
  kStats = 4,     // reply header's `text` is a JSON object of counters and the staleness histogram
  kShutdown = 5,  // server exits after replying
  kHeartbeat = 6, // worker -> server, no reply: the worker is alive (sent once a second per server by a side thread)
  kFinish = 7,    // worker -> server: this worker ended its run normally (it leaves the BSP/SSP count); reply OK.
                  // With data = kFinishStillReading: it pushes no more but still reads (node 0 scoring the
                  // final weights): out of the count at once, the job not over until its plain FINISH.
                  // A server started with server.exit_when_done exits once every worker has finished or died
  kOk = 100,      // reply
  kError = 101,   // reply; `text` says what was wrong
};

// FINISH's `data`: the worker leaves the rounds now and sends its plain FINISH (data -1) after its last read.
constexpr int64_t kFinishStillReading = 1;

struct MsgHeader {
  int type = 0;
  uint32_t version = kPsProtocolVersion;
  uint64_t token = 0;          // digest of the job token
  int32_t worker = -1;         // worker id, 0..workers-1
  int32_t workers = 0;         // INIT: workers in the job
  int64_t clock = 0;           // worker's step of this gradient
  int64_t param_version = 0;   // PUSH: parameter version the gradient was computed on; replies: current version
  int64_t offset = 0;          // range in the flat parameter vector, elements: a server's whole range, or (INIT with
  int64_t length = 0;          // partition > 0) one of its partitions, which every later request and reply names
  int64_t partition = 0;       // INIT: elements per partition of the server's range (dist.ps_partition_mb); 0 = the
                               // whole range is one partition. Each partition is pushed, applied and pulled on its own
  std::string dtype = "f32";   // data frame element type: INIT "f32"; PUSH_PULL the shard's wire format (`wire`)
  std::string wire = "f32";    // INIT: the format of every later push's data ("f32", "bf16", "f16", "i8"; see
                               // common/comm/wire_format.h); fixed by the first INIT, replies are f32
  double lr = 0;               // PUSH: learning rate of this update; INIT: unused
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;  // INIT: AdamW settings
  std::string update = "adamw";  // INIT: what a push carries and how it is applied: "adamw" (a gradient, the shard's
                                 // AdamW), or local SGD's pseudo-gradients under an outer step, "average" / "nesterov"
  double outer_lr = 0.7, outer_momentum = 0.9;  // INIT with update "nesterov" / "delayed_nesterov": the outer SGD's settings
  int64_t outer_delay = 1;     // INIT with update "delayed_nesterov": arrivals per momentum update (N)
  int64_t staleness = 0;       // reply to PUSH: staleness of that update (versions applied since it was read)
  bool overlap = false;        // INIT: the worker overlaps its round trip with the next step (dist.ps_overlap): its
                               // pushes are computed on the read before last (refused with BSP backup workers)
  std::string layout;          // INIT: what every worker of the job must agree on: "<K> shards, servers <digest of the
                               // endpoint list>, model <digest>"; fixed by the first INIT, a different one is refused
  // Elastic membership (dist.elastic; docs/PROTOCOL.md "Joining a running job"):
  bool elastic = false;        // INIT: the job's membership may change (workers join with ids past `workers`, the data
                               // order is granted by the shards); fixed by the first INIT, every worker must agree
  int join = 0;                // INIT: 0 = register at `clock` (a job's start, a resume); 1 = ask which clock a joiner
                               // would start at (the reply's `clock`; registers nothing); 2 = join at `clock` (the
                               // largest answer over every part): under BSP the reply is held until the part's round
                               // reaches it. A reply says which request it answers: join = 1 or 2 for those (version
                               // 11: a late reply to a resent join = 2 is never taken for a push's or a pull's), 0 else
  int64_t samples = 0;         // elastic INIT and PUSH_PULL: training samples one step of this worker takes (the grant's size)
  // A switch into ps mode from a mode whose nodes held AdamW's state (worker/train/mode_switch.h):
  bool moments = false;        // INIT: after the values, the range's AdamW first and then second moments (float32,
                               // `length` each) follow in the data frame; a first INIT (which creates the part) starts
                               // the shard's AdamW from them, later ones are checked like values and otherwise ignored
  int64_t adam_steps = 0;      // INIT with moments: AdamW's step count they were made in (its bias correction goes on)
  int64_t data = -1;           // replies of an elastic job's first part (offset 0): the first sample of the worker's
                               // next step in the job's data order (each sample granted once); -1 = none
  int64_t round = -1;          // replies to PUSH_PULL and INIT under BSP (version 9): the job's frontier, the clock after
                               // the newest closed one (its push applied or dropped, of any worker, finished and dead
                               // ones included; held pushes and held joiners do not move it), so every clock below it
                               // was applied or closed (ParameterShard::round()); -1 under SSP and ASP. A BSP job's
                               // clocks are its steps: a node behind them learns where the job is
  int64_t pushed = -1;         // (version 10) reply to INIT join = 1: the newest clock this part counts as done for the
                               // worker (a push received, or clocks a join skipped it past; -1: none); INIT join = 2: the
                               // largest of those over the worker's parts. The
                               // first part replaces a returning worker's data grant with fresh samples where some part
                               // received a push of the grant's clock (the grant was used), else it keeps it
  std::string text;            // errors, stats JSON
  MSGPACK_DEFINE_MAP(type, version, token, worker, workers, clock, param_version, offset, length, partition, dtype, wire, lr, beta1,
                     beta2, eps, weight_decay, update, outer_lr, outer_momentum, outer_delay, staleness, overlap, layout,
                     elastic, join, samples, moments, adam_steps, data, round, pushed, text)
};

// The header's `token` field: a 64-bit digest of the job token. It is sent in every request, so
// anyone who sees one can reuse it: encrypt the link (CURVE) where the network is not trusted.
uint64_t token_digest(const std::string& token);

std::string encode_header(const MsgHeader& h);
// Decodes and sanity-checks a header frame; throws syncopate::Error (never crashes) on anything
// malformed: oversize, not msgpack, wrong field types, unknown type, wrong protocol version.
MsgHeader decode_header(const void* data, size_t n, size_t limit = kMaxHeaderBytes);
// A reply's header (decoded by a worker from its own, authenticated server): the same checks with
// room for long texts (STATS of a shard with many workers or staleness values; found by fuzzing).
MsgHeader decode_reply(const void* data, size_t n);

}  // namespace syncopate
