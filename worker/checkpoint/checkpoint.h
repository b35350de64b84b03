// Numbered training checkpoints that resume exactly.
//
//   <root>/step_000200/model.safetensors      fp32 weights, Hugging Face GPT-2 names
//   <root>/step_000200/optimizer.safetensors  AdamW moments, RNG states; step in metadata
//   <root>/step_000200/meta.json              step, tokens, config, data position
//   <root>/latest                             name of the newest complete checkpoint
//
// A checkpoint is written into step_N.tmp/ and renamed into place after every file is fsync'ed,
// then `latest` is replaced atomically: a crash at any point leaves the previous checkpoint whole.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace syncopate {
class GPTImpl;
class FlatAdamW;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A checkpoint is taken in two parts: snapshot_checkpoint() at a step boundary, then write_checkpoint().
// opt: the optimizer state this replica holds; null when the parameter servers hold it (ps mode),
// and then optimizer.safetensors carries only the RNG states.
// sync_state: further named tensors of the synchronization (GradientSync::state(), e.g. local SGD's
// round start and outer momentum), kept as "sync.<name>" in optimizer.safetensors.
// What one checkpoint writes, taken from the live model, optimizer and synchronization:
struct CheckpointContents {
  int64_t step = 0;
  NamedTensors model;                              // model.safetensors (HF GPT-2 layout)
  std::map<std::string, std::string> model_info;   // its metadata
  NamedTensors optimizer;                          // optimizer.safetensors: RNG states, moments, "sync.<name>"
  std::map<std::string, std::string> optimizer_info;
  nlohmann::json meta;                             // meta.json
};
// detach = true: every tensor is a CPU copy of its own, so training may go on changing the live
// state while the contents are written (a background write, CheckpointWriter); false: the tensors
// may share the live storage (the write must finish before the next step).
CheckpointContents snapshot_checkpoint(int64_t step, GPTImpl& model, FlatAdamW* opt, const nlohmann::json& meta,
                                       const NamedTensors& sync_state, bool detach);
// Writes the contents as checkpoint contents.step under root atomically (step_N.tmp/, fsync, rename,
// then `latest`), keeps the newest `keep`; returns its directory.
// before_commit (optional): called once the files are written and fsync'ed, before the checkpoint is
// renamed into place. The trainer holds the modelled write time there (emulate.checkpoint_s,
// hold_checkpoint_write), so that a checkpoint becomes durable at the end of its modelled write, as
// it would on the modelled storage: a kill during the write resumes from the one before.
std::string write_checkpoint(const std::string& root, const CheckpointContents& contents, int64_t keep,
                             const std::function<void()>& before_commit = {});
// Sleeps until hold_s seconds have passed since t0_s (monotonic seconds, as now_seconds()).
void hold_checkpoint_write(double t0_s, double hold_s);

// Directory of the newest complete checkpoint under root, or "" if there is none.
std::string latest_checkpoint(const std::string& root);

// Steps of the complete checkpoints under root (step_N/ with all three files), ascending.
std::vector<int64_t> list_checkpoints(const std::string& root);
// Directory of checkpoint `step` under root.
std::string checkpoint_dir(const std::string& root, int64_t step);

// Restores model weights, optimizer state and RNG states from `dir`; returns its meta.json.
// Throws syncopate::Error (and changes nothing it has not validated) for a missing, truncated or
// mismatched checkpoint.
// opt null: the moments are not read (ps mode; a checkpoint written with them loads as well).
// sync_state: the live tensors to restore (each must be in the checkpoint with the same size).
// switching (a resume in another synchronization, worker/train/mode_switch.h): moments or sync
// state the checkpoint does not hold are left as they are instead of refused.
nlohmann::json load_checkpoint(const std::string& dir, GPTImpl& model, FlatAdamW* opt, const NamedTensors& sync_state = {},
                               bool switching = false);
// The checkpoint's meta.json, parsed (an error naming the file when it is not JSON).
nlohmann::json read_checkpoint_meta(const std::string& dir);

// Removes what writes killed mid-way left under root: step_N.tmp/ directories and latest's
// temporary files. Returns how many entries it removed. Called once per run by the node's writer.
int remove_checkpoint_leftovers(const std::string& root);

// Where a job of several nodes resumes: the newest step held by every node (per_node[r]: node r's
// complete checkpoints), -1 when no step is held by all: "no checkpoint" is step 0, which every
// node holds, so such a job starts fresh (a warning names what each node holds) instead of
// failing at every restart (a node killed while writing its first checkpoint).
int64_t agreed_resume_step(const std::vector<std::vector<int64_t>>& per_node);
// The rendezvous blob that carries a node's checkpoint steps, and its decoder (node: for errors).
std::string encode_checkpoint_steps(const std::vector<int64_t>& steps);
std::vector<int64_t> decode_checkpoint_steps(const std::string& blob, int node);

}  // namespace syncopate
