// checkpoint/internal/crc32c.h — CRC-32C (Castagnoli), the checksum of every checkpoint block and of the metadata.
// defines: Crc32c.
//
// CRC-32C because x86-64 computes it in hardware (SSE4.2's crc32 instruction: 8 bytes a cycle with three
// independent chains, crc32c.cc), so the checksum does not slow a save that should run at disk speed; the same
// polynomial as iSCSI, ext4 and TFRecord, so any tool can check a block. A table-driven version serves CPUs without
// SSE4.2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zero::ckpt {

// The CRC-32C of n bytes, continuing from `crc` (0 for a fresh checksum): Crc32c(Crc32c(0, a), b) is the
// checksum of a followed by b. Crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

namespace internal {
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);  // the table version, for the tests
}  // namespace internal

}  // namespace zero::ckpt
