// Low-memory loading under a shard group of several ranks (docs/sharding.md): each rank builds
// only the pieces of each unit that fall in its shard of the unit's flat layout
// (frozen_layout.h), reading only the values under them, and hands FSDP its shard
// directly, so no rank ever holds a whole unit nor reads the whole model.
//
// The building is the model's unit build (model/unit_build.h), the same one that builds a whole
// unit; the encoding is each weight's storage format's (quant/frozen_format.h). What this loader
// adds is where the pieces go and the collective between the build's two steps: statistics that
// cross shards (NF4: a rank may own a weight's absmax codes without the codes of those blocks,
// and double quantisation needs the tensor-wide mean) are computed by the rank(s) reading their
// values and max-reduced over the shard group, so every rank finishes the build with all of them
// and the bytes are the same at any world size.
#pragma once
#include "fsdp/fsdp.h"
#include "model/llama_model.h"
#include "runtime/world.h"

namespace fsdpq {

// The loader for LlamaModel::load / ::random. Every rank of the world must load the same units
// in the same order (the model builder does): each unit's reading is agreed over the world before
// its collective, so a rank that fails to read ends every rank with its message. Fault injection
// point: load_unit_<U> (runtime/fault_injection.h).
UnitLoader shard_loader(const World& world, Fsdp& fsdp);

}  // namespace fsdpq
