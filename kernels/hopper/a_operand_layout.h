// Where a warp's lanes point ldmatrix.x4 to load wgmma's register A operand (m64k16, 16 rows a warp)
// from a tile the copy engine wrote with the 128-byte swizzle: rows of 128 bytes whose 16-byte
// chunk c sits at chunk c ^ (row % 8). Plain C++ for host and device, so a CPU test
// (tests/unit/kernels_lora_fused_sm90a_layout_test.cpp) checks it against the hardware's rules.
// Used by the LoRA down and input-gradient kernels and the attention backward's dQ kernel.
#pragma once

#include "kernels/host_device.h"

namespace fsdpq::hopper_layout {

// The byte offset, in a swizzled tile of 64-column (128-byte) rows starting at the warpgroup's
// first row, of the 16-byte row segment lane `lane` of warp `warp` hands ldmatrix.x4 for slice kk
// (columns 16kk .. 16kk + 15): lanes 0-7, 8-15, 16-23, 24-31 address matrices 0-3 (rows 0-7 and
// 8-15 of the warp's 16, columns 0-7 then 8-15 of the slice), whose fragments are registers 0-3:
// rows g and g + 8 (g = lane / 4), columns 2·(lane % 4) and + 1, then the same 8 columns on.
FSDPQ_HOST_DEVICE_INLINE int a_operand_ldmatrix_offset(int warp, int lane, int kk) {
  const int row = 16 * warp + lane % 16, chunk = 2 * kk + lane / 16;
  return row * 128 + (chunk ^ (row % 8)) * 16;
}

}  // namespace fsdpq::hopper_layout
