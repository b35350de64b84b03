#include "common/trace.h"

#include <chrono>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"

namespace syncopate {

Tracer& Tracer::global() {
  static Tracer t;
  return t;
}

Tracer::~Tracer() { close(); }

int64_t Tracer::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int Tracer::thread_track() {
  static std::atomic<int> next{1};
  thread_local int track = next++;
  return track;
}

void Tracer::open(const std::string& path, const std::string& process) {
  close();
  {
    std::lock_guard<std::mutex> l(mu_);
    f_ = std::fopen(path.c_str(), "w");
    SYN_CHECK(f_ != nullptr, fmt::format("cannot write the trace file '{}': {}", path, std::strerror(errno)),
              "give --trace.file a path in a directory that exists and is writable");
    path_ = path;
    pid_ = static_cast<int>(::getpid());
    first_ = true;
    buf_ = "[\n";
    on_ = true;
  }
  append(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":{}}}}})", pid_,
                     nlohmann::json(process).dump()));
}

void Tracer::close() {
  std::lock_guard<std::mutex> l(mu_);
  if (!f_) return;
  on_ = false;
  buf_ += "\n]\n";
  flush_locked();
  std::fclose(f_);
  f_ = nullptr;
}

void Tracer::flush_locked() {
  if (f_ && !buf_.empty()) std::fwrite(buf_.data(), 1, buf_.size(), f_);
  buf_.clear();
}

void Tracer::append(const std::string& event) {
  std::lock_guard<std::mutex> l(mu_);
  if (!f_) return;
  if (!first_) buf_ += ",\n";
  first_ = false;
  buf_ += event;
  if (buf_.size() >= 64 * 1024) flush_locked();
}

void Tracer::name_thread(const std::string& name) { name_track(thread_track(), name); }

void Tracer::name_track(int track, const std::string& name) {
  if (!on()) return;
  append(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":{}}}}})", pid_, track,
                     nlohmann::json(name).dump()));
}

void Tracer::complete(const char* name, const char* category, int64_t start_us, int64_t end_us, int track,
                      const std::string& args) {
  if (!on()) return;
  append(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{}{}{}{}}})", name, category,
                     start_us, std::max<int64_t>(end_us - start_us, 0), pid_, track < 0 ? thread_track() : track,
                     args.empty() ? "" : R"(,"args":{)", args, args.empty() ? "" : "}"));
}

void Tracer::clock_sync(const std::string& reference, double offset_us, double rtt_us) {
  if (!on()) return;
  append(fmt::format(R"({{"name":"clock_sync","ph":"M","pid":{},"tid":0,"args":{{"reference":{},"offset_us":{},"rtt_us":{}}}}})",
                     pid_, nlohmann::json(reference).dump(), offset_us, rtt_us));
}

}  // namespace syncopate
