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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace syncopate {
class GPTImpl;
class FlatAdamW;

// Writes checkpoint `step`, keeps the newest `keep` and deletes older ones. Returns its directory.
std::string save_checkpoint(const std::string& root, int64_t step, GPTImpl& model, FlatAdamW& opt,
                            const nlohmann::json& meta, int64_t keep);

// Directory of the newest complete checkpoint under root, or "" if there is none.
std::string latest_checkpoint(const std::string& root);

// Steps of the complete checkpoints under root (step_N/ with all three files), ascending.
std::vector<int64_t> list_checkpoints(const std::string& root);
// Directory of checkpoint `step` under root.
std::string checkpoint_dir(const std::string& root, int64_t step);

// Restores model weights, optimizer state and RNG states from `dir`; returns its meta.json.
// Throws syncopate::Error (and changes nothing it has not validated) for a missing, truncated or
// mismatched checkpoint.
nlohmann::json load_checkpoint(const std::string& dir, GPTImpl& model, FlatAdamW& opt);

}  // namespace syncopate
