// One task at a time on a thread of its own: what a checkpoint written in the background needs
// (the worker's CheckpointWriter, a parameter server's shard checkpoints). The owner submits a task
// that works on data it handed over (a detached snapshot), goes on with its own work, and learns
// later whether the task is done (idle()), waits for it (wait()), and whether it failed (a failure
// is reported once, with the label it was submitted with).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace syncopate {

class BackgroundTask {
 public:
  struct Failure {
    std::string label;  // the failed task's, as submitted
    std::string what;   // its exception's message
  };

  BackgroundTask();
  ~BackgroundTask();  // waits for the task in flight; a failure nobody took is logged
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;

  // Starts `task` on the thread, after waiting for the one in flight.
  void submit(std::string label, std::function<void()> task);
  // Waits until nothing is in flight; returns how long it waited, seconds.
  double wait();
  bool idle() const;
  // Tasks finished so far (failed ones included).
  int64_t finished() const;
  // A failure since the last call (once), or false; *out receives it.
  bool take_failure(Failure* out);

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;
  std::string label_;
  bool busy_ = false, stop_ = false, failed_ = false;
  Failure failure_;
  int64_t finished_ = 0;
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace syncopate
