// A timeline of one process in Chrome's trace event format (the JSON array that Perfetto and
// chrome://tracing open): complete events ("ph": "X", a name, a start and a duration in
// microseconds) on named tracks. Workers and servers write one file each (--trace.file); the
// phases of every step, each gradient region's reduction, each shard's round trip, the servers'
// apply and wait in their consistency rule. scripts/merge_traces.py aligns the files' clocks and
// merges them into one.
//
// Time is the system clock in microseconds since the Unix epoch, so files of one host line up as
// they are; across hosts, a process records its measured offset to a reference (node 0 at the
// rendezvous, shard 0 in ps mode) as a "clock_sync" event, which the merge applies.
//
// Off (the default) it costs one relaxed atomic load per span. On, an event is formatted into a
// buffer under a mutex and written out in blocks of 64 KiB and at close(); the file is opened at
// start, so a path that cannot be written fails then, not at the end of the run.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace syncopate {

// [trace]: where this process writes its timeline.
struct TraceConfig {
  std::string file = "";  // Chrome trace JSON of this process; "" = no tracing (nothing recorded)

  template <class V>
  void fields(V& v) {
    v("file", file, "Chrome trace JSON (Perfetto, chrome://tracing) of this process's timeline; empty = off");
  }
};

class Tracer {
 public:
  // The process's tracer (off until open()).
  static Tracer& global();
  ~Tracer();

  // Starts writing to `path` (truncated); `process` names this process in the viewer. Throws
  // syncopate::Error naming the path when it cannot be written.
  void open(const std::string& path, const std::string& process);
  // Writes what is buffered and the closing bracket; the tracer is off afterwards.
  void close();
  bool on() const { return on_.load(std::memory_order_relaxed); }

  static int64_t now_us();
  // The calling thread's track (a small number, assigned on first use), and its name.
  static int thread_track();
  void name_thread(const std::string& name);
  // A track that is not a thread (a shard's round trips, a worker as the server sees it).
  void name_track(int track, const std::string& name);

  // One complete event [start_us, end_us) on `track` (-1: the calling thread's). args: a JSON
  // object's members without braces (e.g. "\"bytes\":42"), or empty.
  void complete(const char* name, const char* category, int64_t start_us, int64_t end_us, int track = -1,
                const std::string& args = "");
  // This process's clock minus `reference`'s, measured with a round trip of rtt_us (the error is
  // at most half of it).
  void clock_sync(const std::string& reference, double offset_us, double rtt_us);

 private:
  void append(const std::string& event);
  void flush_locked();
  std::atomic<bool> on_{false};
  std::mutex mu_;
  std::FILE* f_ = nullptr;
  std::string buf_, path_;
  bool first_ = true;
  int pid_ = 0;
};

// RAII: the global tracer writes to `path` for this object's lifetime (nothing when path is empty).
class TraceSession {
 public:
  TraceSession(const std::string& path, const std::string& process) : on_(!path.empty()) {
    if (on_) Tracer::global().open(path, process);
  }
  ~TraceSession() {
    if (on_) Tracer::global().close();
  }
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

 private:
  bool on_;
};

// RAII: an event from construction to destruction on the calling thread's track, when tracing is
// on. `name` and `category` must outlive the span (string literals).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category)
      : name_(name), category_(category), start_(Tracer::global().on() ? Tracer::now_us() : -1) {}
  ~TraceSpan() {
    if (start_ >= 0) Tracer::global().complete(name_, category_, start_, Tracer::now_us());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_;
};

}  // namespace syncopate
