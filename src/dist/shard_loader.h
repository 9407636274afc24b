// Low-memory loading under a shard group of several ranks (docs/sharding.md): each rank reads
// from the weight source only the elements that fall in its shard of each unit's flat layout
// (frozen_layout.h), quantises only the NF4 blocks those elements belong to, and hands the engine
// its shard directly, so no rank ever holds a whole unit nor reads the whole model.
//
// NF4 statistics cross shards: a rank may own a weight's absmax codes or group scales without
// owning the codes of those blocks, and double quantisation needs the tensor-wide mean of the
// absmax and each 256-block group's maximum. So every block's absmax is computed by the rank(s)
// holding its packed codes, the absmax of the unit's NF4 weights is all-reduced (max) over the
// shard group, and every rank then double-quantises each whole absmax vector exactly as the
// single-rank code does: the bytes are the same at any world size.
#pragma once
#include "dist/fsdp_engine.h"
#include "model/llama_model.h"
#include "runtime/world.h"

namespace fsdpq {

// The loader for LlamaModel::load / ::random. Every rank of the world must load the same units
// in the same order (the model builder does): each unit's reading is agreed over the world before
// its collective, so a rank that fails to read ends every rank with its message. Fault injection
// point: load_unit_<U> (runtime/fault_injection.h).
UnitLoader shard_loader(const World& world, FsdpEngine& engine);

}  // namespace fsdpq
