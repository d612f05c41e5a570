/* runtime/crc32c.h — CRC-32C (Castagnoli), the checksum of checkpoint shards (DESIGN 5).
 *
 * Polynomial 0x1EDC6F41 (reflected 0x82F63B78), initial value and final xor 0xFFFFFFFF:
 * crc32c("123456789", 9) = 0xE3069283, the same digest as iSCSI, ext4 and Python's `crc32c`.
 * crc32c_extend continues a digest over more bytes, so a large dataset can be checked in
 * blocks: crc32c_extend(crc32c(a), b) == crc32c(a followed by b), and crc32c_extend(0, ...)
 * == crc32c(...). On x86-64 with SSE4.2 the CPU's crc32 instruction is used; elsewhere a
 * slicing-by-8 table. Both give the same digest; nothing here allocates.
 */
#ifndef FATHOM_RUNTIME_CRC32C_H
#define FATHOM_RUNTIME_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(const void *data, size_t bytes);
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t bytes);
/* The table-driven path, always available (tests hold the fast path against it). */
uint32_t crc32c_extend_portable(uint32_t crc, const void *data, size_t bytes);

#endif
