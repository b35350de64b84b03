#include "common/text/tokenizer.h"

#include "common/check.h"
#include "common/text/byte_tokenizer.h"
#include "common/text/gpt2_bpe.h"

namespace syncopate {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& c) {
  if (c.type == "byte" || c.type == "ByteTokenizer") return std::make_unique<ByteTokenizer>();
  if (c.type == "gpt2-bpe" || c.type == "GPT2BPETokenizer") return std::make_unique<Gpt2Bpe>(c.vocab_file, c.merge_file);
  SYN_FAIL(fmt::format("unknown tokenizer type '{}'", c.type),
           "use 'byte' or 'gpt2-bpe' (Megatron-LM's GPT2BPETokenizer)");
}

}  // namespace syncopate
