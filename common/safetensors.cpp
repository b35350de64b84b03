#include "common/safetensors.h"

#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"

namespace syncopate {
namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool}};

at::ScalarType dtype_from(const std::string& s, const std::string& path) {
  for (const auto& d : kDtypes)
    if (s == d.name) return d.type;
  SYN_FAIL(fmt::format("'{}': unsupported safetensors dtype '{}'", path, s),
           "convert the tensor to F32, F16, BF16 or an integer type");
}

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (t == d.type) return d.name;
  SYN_FAIL(fmt::format("cannot save tensors of type {} to safetensors", c10::toString(t)),
           "convert to float32 first");
}

}  // namespace

Safetensors load_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  const std::string hint = "the file is truncated or not safetensors; restore it from a good copy";
  SYN_CHECK(bytes.size() >= 8, fmt::format("'{}' is too short to be safetensors ({} bytes)", path, bytes.size()), hint);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  SYN_CHECK(n <= bytes.size() - 8,
            fmt::format("'{}': header length {} exceeds the file size {}", path, n, bytes.size()), hint);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const std::exception& e) {
    SYN_FAIL(fmt::format("'{}': header is not valid JSON: {}", path, e.what()), hint);
  }
  SYN_CHECK(header.is_object(), fmt::format("'{}': header is not a JSON object", path), hint);
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  Safetensors out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) continue;
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) out.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    const auto& e = it.value();
    try {
      auto type = dtype_from(e.at("dtype").get<std::string>(), path);
      std::vector<int64_t> shape = e.at("shape").get<std::vector<int64_t>>();
      auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
      SYN_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size,
                fmt::format("'{}': tensor '{}' lies outside the file's data", path, it.key()), hint);
      uint64_t numel = 1;
      for (auto d : shape) {
        SYN_CHECK(d >= 0 && d < (int64_t{1} << 40), fmt::format("'{}': tensor '{}' has a bad shape", path, it.key()), hint);
        numel *= static_cast<uint64_t>(d);
      }
      const uint64_t nbytes = numel * at::elementSize(type);
      SYN_CHECK(nbytes == off[1] - off[0],
                fmt::format("'{}': tensor '{}' needs {} bytes but spans {}", path, it.key(), nbytes, off[1] - off[0]), hint);
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
      if (nbytes) std::memcpy(t.data_ptr(), data + off[0], nbytes);
      out.tensors.emplace(it.key(), std::move(t));
    } catch (const nlohmann::json::exception& ex) {
      SYN_FAIL(fmt::format("'{}': malformed entry for tensor '{}': {}", path, it.key(), ex.what()), hint);
    }
  }
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const std::function<void()>& before_commit) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(at::kCPU).contiguous();
    uint64_t nbytes = c.numel() * c.element_size();
    header[name] = {{"dtype", dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align data to 8 bytes, as the reference writer does
  uint64_t n = h.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  AtomicFile f(path);
  f.write(len, 8);
  f.write(h);
  for (const auto& c : cpu) f.write(c.data_ptr(), c.numel() * c.element_size());
  if (before_commit) before_commit();
  f.commit();
}

}  // namespace syncopate
