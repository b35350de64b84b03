#include "worker/train/run_config.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/fnv1a.h"

namespace syncopate {

std::string RunConfig::fingerprint() const {
  RunConfig copy = *this;
  ConfigSchema s;
  s.section("model", copy.model);
  s.section("optim", copy.optim);
  s.section("schedule", copy.schedule);
  std::string text = s.to_toml() + fmt::format("steps={} batch={} accum={} seed={}", train.steps, train.batch_size,
                                               train.grad_accum, train.seed);
  // How the nodes synchronize, written out so that a mismatch names the field: every node must issue
  // the same collectives (buckets, segments, hierarchy) and combine them alike (mode, local SGD's
  // outer step, wire, clipping). Nodes of a --dist.mode=auto job that read different advice files
  // stop here, at the rendezvous, instead of hanging or averaging different things.
  // Only the fields that apply: a field without effect may differ between nodes.
  const DistConfig& d = dist;
  std::string sync = fmt::format("[dist] mode={} sync_every={} wire={} clip_scope={} overlap={} segment_kb={}", d.mode,
                                 d.sync_every, d.wire, d.clip_scope, d.overlap, d.segment_kb);
  if (d.sync_every > 1) sync += fmt::format(" outer={} outer_lr={} outer_momentum={}", d.outer, d.outer_lr, d.outer_momentum);
  if (d.overlap) sync += fmt::format(" bucket_kb={} first_bucket_kb={}", d.bucket_kb, d.first_bucket_kb);
  if (d.local_replicas != 1) sync += " hierarchy=" + d.hierarchy;
  // Also alike: when the replicas are compared (a collective every check_every steps) and which
  // steps are skipped (decided on the averaged gradient by each node's own threshold).
  sync += fmt::format(" check_every={} skip_grad_norm={} max_skipped_steps={}", d.check_every, train.skip_grad_norm,
                      train.max_skipped_steps);
  return fmt::format("{:016x} {}", fnv1a64(text), sync);
}

std::string RunConfig::model_fingerprint() const {
  RunConfig copy = *this;
  ConfigSchema s;
  s.section("model", copy.model);
  return fmt::format("{:016x}", fnv1a64(s.to_toml()));
}

void RunConfig::validate() const {
  syncopate::validate(model);
  emulate.validate();
  SYN_CHECK(dist.mode != "auto", "dist.mode=auto was not resolved to a mode",
            "syncopate-worker resolves it from dist.advice (worker/sync/advice.h); elsewhere give ring, ps or none");
  SYN_CHECK(schedule.min_lr <= optim.lr,
            fmt::format("schedule.min_lr={} exceeds optim.lr={}", schedule.min_lr, optim.lr),
            "the cosine decay goes down from optim.lr to schedule.min_lr: lower min_lr");
  SYN_CHECK(schedule.warmup_steps <= train.steps,
            fmt::format("schedule.warmup_steps={} exceeds train.steps={}", schedule.warmup_steps, train.steps),
            "shorten the warmup or train longer");
  SYN_CHECK(data.val_file.empty() || !data.train_file.empty(), "data.val_file is set but data.train_file is not",
            "set data.train_file too, or neither (data.corpus is then split)");
  SYN_CHECK(dist.mode != "ps" || !dist.servers.empty(), "dist.mode=ps needs dist.servers",
            "list the parameter-server endpoints, e.g. --dist.servers=tcp://10.0.0.1:29501,tcp://10.0.0.2:29501 "
            "(scripts/local_cluster.sh --servers K does it for a local cluster)");
  SYN_CHECK(!dist.ps_push_in_backward || (optim.grad_clip == 0 && !dist.ps_overlap),
            "dist.ps_push_in_backward sends each shard's gradient before backward ends, so it cannot be clipped by the "
            "global norm first, and it replaces the overlap thread",
            "set --optim.grad_clip=0 and --dist.ps_overlap=false, or turn ps_push_in_backward off");
  SYN_CHECK(dist.mode != "ps" || dist.clip_scope != "job",
            "dist.clip_scope=job with dist.mode=ps: parameter servers combine gradients after each node has clipped its own",
            "use --dist.clip_scope=node (or auto); to compare a ring with BSP like for like, give the ring "
            "--dist.clip_scope=node too");
  SYN_CHECK(dist.sync_every == 1 || dist.mode != "none",
            fmt::format("dist.sync_every={} (local SGD / DiLoCo) with dist.mode=none", dist.sync_every),
            "local SGD synchronizes nodes: use --dist.mode=ring or ps, or sync_every=1");
  SYN_CHECK(dist.sync_every == 1 || (!dist.ps_overlap && !dist.ps_push_in_backward),
            "dist.ps_overlap / ps_push_in_backward with dist.sync_every > 1",
            "local SGD pushes once per round, after its last inner step: turn them off");
  SYN_CHECK(!dist.elastic || dist.mode == "ring" || (dist.mode == "ps" && !dist.ps_overlap),
            fmt::format("dist.elastic=true with dist.mode={}, ps_overlap={}", dist.mode, dist.ps_overlap),
            "elastic membership is built for --dist.mode=ring and --dist.mode=ps (every step, or local SGD / DiLoCo "
            "with sync_every > 1: joins and leaves at round boundaries) without ps_overlap (an overlapped step would "
            "start before the servers granted its data): set --dist.ps_overlap=false");
  SYN_CHECK(!dist.elastic || dist.mode != "ring" || dist.local_replicas <= 1,
            fmt::format("dist.elastic with dist.mode=ring and dist.local_replicas={}", dist.local_replicas),
            "the elastic ring takes one replica per node: --dist.local_replicas=1, or one process per GPU (--dist.launch=gpu)");
  SYN_CHECK(dist.sync_every == 1 || dist.clip_scope != "job",
            "dist.clip_scope=job with dist.sync_every > 1: between synchronizations each node steps on its own gradient",
            "use --dist.clip_scope=node (or auto)");
  SYN_CHECK(dist.outer != "delayed_nesterov" || dist.sync_every == 1 || dist.mode == "ps",
            fmt::format("dist.outer=delayed_nesterov with dist.mode={}", dist.mode),
            "delayed Nesterov spreads momentum over asynchronous arrivals at parameter servers; a ring applies one "
            "mean per round: use --dist.outer=nesterov there");
  SYN_CHECK(dist.wire != "int8" || dist.mode == "ps",
            fmt::format("dist.wire=int8 with dist.mode={}", dist.mode),
            "int8 (with error feedback) travels to parameter servers; a ring would requantize at every hop: use bf16 or fp16");
  SYN_CHECK(dist.sync_every == 1 || train.steps % dist.sync_every == 0,
            fmt::format("train.steps={} is not a multiple of dist.sync_every={}: the last {} inner steps would never reach "
                        "the job's weights (no outer step after them)", train.steps, dist.sync_every,
                        train.steps % dist.sync_every),
            fmt::format("use train.steps={} or {}", train.steps - train.steps % dist.sync_every,
                        train.steps - train.steps % dist.sync_every + dist.sync_every));
  // emulate.overlap gates the regions that leave during backward: a mode that sends none would
  // silently run without overlap while the study says it had it.
  if (emulate.overlap) {
    SYN_CHECK(emulate.enabled(), "emulate.overlap=true without a modelled step time",
              "set --emulate.step_time_s (overlap places gradient regions on the modelled step's timeline)");
    SYN_CHECK(dist.sync_every == 1, "emulate.overlap=true with local SGD (dist.sync_every > 1): nothing leaves a node "
              "during backward", "turn emulate.overlap off for local SGD");
    SYN_CHECK(dist.mode != "ring" || (dist.overlap && dist.clip_scope != "node"),
              "emulate.overlap=true on the ring without bucket reductions during backward (dist.overlap=false, or "
              "dist.clip_scope=node, which needs the whole gradient before anything is sent)",
              "set --dist.overlap=true --dist.clip_scope=job (and --optim.grad_clip=0 to clip alike with ps pushes "
              "during backward), or turn emulate.overlap off");
    SYN_CHECK(dist.mode != "ps" || dist.ps_push_in_backward,
              "emulate.overlap=true in ps mode without dist.ps_push_in_backward: the pushes leave after backward",
              "set --dist.ps_push_in_backward=true --optim.grad_clip=0, or turn emulate.overlap off");
  }
  SYN_CHECK(emulate.latency_ms == 0 || dist.mode == "ring",
            fmt::format("emulate.latency_ms={} with dist.mode={}: the worker delays only ring messages", emulate.latency_ms,
                        dist.mode),
            dist.mode == "ps" ? "in ps mode every message passes a server: set --server.latency_ms on each syncopate-server "
                                "(scripts/local_cluster.sh --latency-ms sets the right one per mode)"
                              : "a single node has no links: drop --emulate.latency_ms");
  SYN_CHECK(emulate.latency_ms / 1e3 < dist.timeout_s / 2,
            fmt::format("emulate.latency_ms={} is not below half of dist.timeout_s={} s: a ring message held that long "
                        "would count as a silent peer", emulate.latency_ms, dist.timeout_s),
            "lower emulate.latency_ms or raise dist.timeout_s");
  SYN_CHECK(data.tokenizer == "byte" || data.tokenizer == "gpt2-bpe",
            fmt::format("data.tokenizer='{}' is not a tokenizer", data.tokenizer), "use byte or gpt2-bpe");
  SYN_CHECK(data.tokenizer != "gpt2-bpe" || (!data.vocab_file.empty() && !data.merge_file.empty()),
            "data.tokenizer=gpt2-bpe needs data.vocab_file and data.merge_file",
            "point them at the tokenizer's vocab.json and merges.txt");
}

}  // namespace syncopate
