// The few settings of a sentencepiece model that decide whether a long text may be cut before it is
// encoded (docs/data.md, "Long texts"), read from the serialized ModelProto. Debian ships no header
// for sentencepiece_model.proto, so the handful of fields are read from the protobuf wire format.
#pragma once
#include <string_view>

namespace fsdpq::data {

// TrainerSpec.model_type.
enum class SentencePieceModelType { Unigram = 1, Bpe = 2, Word = 3, Char = 4 };

// Unset fields keep sentencepiece_model.proto's defaults.
struct SentencePieceSpec {
  SentencePieceModelType model_type = SentencePieceModelType::Unigram;  // TrainerSpec field 3
  bool treat_whitespace_as_suffix = false;                              // TrainerSpec field 24
  bool has_precompiled_charsmap = false;  // NormalizerSpec field 2 non-empty: rule-based normalization
  bool add_dummy_prefix = true;           // NormalizerSpec field 3
  bool remove_extra_whitespaces = true;   // NormalizerSpec field 4
  bool escape_whitespaces = true;         // NormalizerSpec field 5
};

// Reads the fields above from a serialized ModelProto (SentencePieceProcessor::serialized_model_proto).
// `source` names the model in the error for bytes that are not a protobuf message.
SentencePieceSpec read_sentencepiece_spec(std::string_view serialized, std::string_view source);

}  // namespace fsdpq::data
