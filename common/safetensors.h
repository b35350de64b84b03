// Reader and writer for the safetensors format (8-byte little-endian header length, JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then raw little-endian data).
// Every size and offset is validated, so a truncated or hostile file is an error, not a crash.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace syncopate {

struct Safetensors {
  std::map<std::string, at::Tensor> tensors;        // CPU tensors, owned
  std::map<std::string, std::string> metadata;      // "__metadata__"
};

// Loads a file; throws syncopate::Error naming the file and the problem.
Safetensors load_safetensors(const std::string& path);

// Writes atomically (temporary file, fsync, rename). Tensors are written in the given order,
// converted to contiguous CPU tensors. Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
// before_commit (optional): called once the temporary file is written, before it is synced and
// renamed into place (a modelled write time is held there, so the file appears at its end).
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::function<void()>& before_commit = {});

}  // namespace syncopate
