// A file written whole or not at all, without syncing it to storage: it is written as PATH.tmp and
// renamed into place, so a reader never finds half of it. For files a crash may lose but must not
// leave half written (the demo's data, a trained tokenizer); io/model_files.h's
// write_file_atomically also syncs.
#pragma once
#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace fsdpq {

// Writes `path` through `write`, which fills the stream. A failed open, write or rename is a
// UserError (after a failed rename the temporary file is removed); `what` names the file in the
// rename's message ("the trained tokenizer"), by default the temporary file's path.
void write_via_temp(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write,
                    std::string_view what = {});

}  // namespace fsdpq
