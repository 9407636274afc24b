#include "app/commands.h"
#include "util/error.h"

namespace fsdpq {
// Filled in as the model-file and tokenizer modules land.
int run_init_model_command(const World&, const std::vector<std::string>&) { fail("init-model: not built yet"); }
int run_init_tokenizer_command(const World&, const std::vector<std::string>&) { fail("init-tokenizer: not built yet"); }
int run_demo_command(const World&, const std::vector<std::string>&) { fail("demo: not built yet"); }
}  // namespace fsdpq
