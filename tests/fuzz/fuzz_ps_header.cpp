// libFuzzer target for the parameter-server header decoder: any byte string must either decode
// or raise syncopate::Error; nothing else (no crash, no other exception, no sanitizer report).
// Build and run: scripts/fuzz_ps_header.sh [seconds]
#include <cstddef>
#include <cstdint>

#include "common/check.h"
#include "server/ps_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    syncopate::MsgHeader h = syncopate::decode_header(data, size);
    std::string again = syncopate::encode_header(h);  // a decoded header must re-encode and decode
    syncopate::decode_header(again.data(), again.size());
  } catch (const syncopate::Error&) {
  }
  return 0;
}
