#include "data/sentencepiece_spec.h"

#include <cstdint>

#include "util/error.h"

namespace fsdpq::data {

namespace {

// ModelProto's fields, and those of its TrainerSpec and NormalizerSpec that are read.
constexpr uint64_t kTrainerSpec = 2, kNormalizerSpec = 3;
constexpr uint64_t kModelType = 3, kTreatWhitespaceAsSuffix = 24;
constexpr uint64_t kPrecompiledCharsmap = 2, kAddDummyPrefix = 3, kRemoveExtraWhitespaces = 4,
                   kEscapeWhitespaces = 5;

// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

struct Field {
  uint64_t number = 0;
  int wire_type = 0;
  uint64_t varint = 0;     // kVarint
  std::string_view bytes;  // kLengthDelimited
};

// Walks the fields of one protobuf message.
class WireReader {
 public:
  WireReader(std::string_view message, std::string_view source) : rest_(message), source_(source) {}
  bool done() const { return rest_.empty(); }

  Field next() {
    Field f;
    const uint64_t key = varint();
    f.number = key >> 3;
    f.wire_type = static_cast<int>(key & 7);
    switch (f.wire_type) {
      case kVarint: f.varint = varint(); break;
      case kFixed64: take(8); break;
      case kFixed32: take(4); break;
      case kLengthDelimited: f.bytes = take(varint()); break;
      default: broken(fmt::format("field {} has wire type {}", f.number, f.wire_type));
    }
    return f;
  }

 private:
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) broken("a number runs past the end");
      const auto byte = static_cast<uint8_t>(rest_.front());
      rest_.remove_prefix(1);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
    broken("a number is longer than 64 bits");
  }

  std::string_view take(uint64_t n) {
    if (n > rest_.size()) broken(fmt::format("a field of {} bytes runs past the end", n));
    std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }

  [[noreturn]] void broken(const std::string& why) const {
    fail("tokenizer '{}' is not a valid sentencepiece model: {}", source_, why);
  }

  std::string_view rest_;
  std::string_view source_;
};

void read_trainer_spec(std::string_view message, std::string_view source, SentencePieceSpec& spec) {
  for (WireReader r(message, source); !r.done();) {
    const Field f = r.next();
    if (f.wire_type != kVarint) continue;
    if (f.number == kModelType) spec.model_type = static_cast<SentencePieceModelType>(f.varint);
    if (f.number == kTreatWhitespaceAsSuffix) spec.treat_whitespace_as_suffix = f.varint != 0;
  }
}

void read_normalizer_spec(std::string_view message, std::string_view source, SentencePieceSpec& spec) {
  for (WireReader r(message, source); !r.done();) {
    const Field f = r.next();
    if (f.number == kPrecompiledCharsmap && f.wire_type == kLengthDelimited)
      spec.has_precompiled_charsmap = !f.bytes.empty();
    if (f.wire_type != kVarint) continue;
    if (f.number == kAddDummyPrefix) spec.add_dummy_prefix = f.varint != 0;
    if (f.number == kRemoveExtraWhitespaces) spec.remove_extra_whitespaces = f.varint != 0;
    if (f.number == kEscapeWhitespaces) spec.escape_whitespaces = f.varint != 0;
  }
}

}  // namespace

SentencePieceSpec read_sentencepiece_spec(std::string_view serialized, std::string_view source) {
  SentencePieceSpec spec;
  for (WireReader r(serialized, source); !r.done();) {
    const Field f = r.next();
    if (f.wire_type != kLengthDelimited) continue;
    if (f.number == kTrainerSpec) read_trainer_spec(f.bytes, source, spec);
    if (f.number == kNormalizerSpec) read_normalizer_spec(f.bytes, source, spec);
  }
  return spec;
}

}  // namespace fsdpq::data
