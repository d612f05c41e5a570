/* runtime/crc32c.c — CRC-32C, table-driven with an SSE4.2 fast path. See crc32c.h. */
#include "runtime/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLYNOMIAL_REFLECTED 0x82F63B78u

/* table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8, Intel's scheme). */
static uint32_t table[8][256];

static void crc32c_build_table(void)
{
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc >> 1) ^ (CRC32C_POLYNOMIAL_REFLECTED & (0u - (crc & 1u)));
        table[0][byte] = crc;
    }
    for (uint32_t byte = 0; byte < 256; byte++)
        for (int k = 1; k < 8; k++)
            table[k][byte] = (table[k - 1][byte] >> 8) ^ table[0][table[k - 1][byte] & 0xFF];
}

static void crc32c_ensure_table(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc32c_build_table);
}

uint32_t crc32c_extend_portable(uint32_t crc, const void *data, size_t bytes)
{
    crc32c_ensure_table();
    const unsigned char *p = data;
    crc = ~crc;
    while (bytes > 0 && ((uintptr_t)p & 7) != 0) {
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
        bytes--;
    }
    while (bytes >= 8) {
        /* the algorithm is defined on the byte stream, so assemble the word little-endian */
        uint32_t low = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24;
        low ^= crc;
        crc = table[7][low & 0xFF] ^ table[6][(low >> 8) & 0xFF] ^
              table[5][(low >> 16) & 0xFF] ^ table[4][low >> 24] ^ table[3][p[4]] ^
              table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
        p += 8;
        bytes -= 8;
    }
    while (bytes-- > 0)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t crc32c_extend_sse42(uint32_t crc, const void *data, size_t bytes)
{
    const unsigned char *p = data;
    uint64_t state = ~crc;
    while (bytes > 0 && ((uintptr_t)p & 7) != 0) {
        state = _mm_crc32_u8((uint32_t)state, *p++);
        bytes--;
    }
    while (bytes >= 8) {
        uint64_t word;
        memcpy(&word, p, 8); /* x86 is little-endian: the word is the byte stream */
        state = _mm_crc32_u64(state, word);
        p += 8;
        bytes -= 8;
    }
    while (bytes-- > 0)
        state = _mm_crc32_u8((uint32_t)state, *p++);
    return ~(uint32_t)state;
}

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t bytes)
{
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_extend_sse42(crc, data, bytes);
    return crc32c_extend_portable(crc, data, bytes);
}
#else
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t bytes)
{
    return crc32c_extend_portable(crc, data, bytes);
}
#endif

uint32_t crc32c(const void *data, size_t bytes)
{
    return crc32c_extend(0, data, bytes);
}
