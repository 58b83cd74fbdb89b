/*
CRC-32 as zlib computes it (ISO-HDLC: reflected polynomial 0xEDB88320, initial value and final
xor 0xFFFFFFFF), so that Python checks our files with zlib.crc32 and no package:
crc32("123456789") = 0xCBF43926. It protects the tensor containers (llmc/data/tensor_file.h), the
token shards and their sidecars (dataloader.h), the tokenizer and eval-set files (tokenizer.h,
evalset.h); doc/formats.md says what each checksum covers. Slicing by 16, the tables computed at
compile time (Crc32Tables). Little-endian hosts only, as are all the file formats. Host-only C++17.
*/
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "llmc/data/crc32.h reads 8-byte words as little-endian"
#endif

// "Slicing by 16": t[0] is the classic byte-at-a-time table (the CRC of each byte value); t[k][b]
// is the CRC of byte b followed by k zero bytes, so sixteen bytes are folded into the running CRC
// with sixteen independent lookups instead of sixteen dependent byte steps (test_crc32 prints
// both speeds: 4-9x the one-table loop's). The 16 KiB of tables are computed at compile time.
struct Crc32Tables {
    uint32_t t[16][256];
    constexpr Crc32Tables() : t() {
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t c = b;
            for (int k = 0; k < 8; k++) { c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1; }
            t[0][b] = c;
        }
        for (int k = 1; k < 16; k++) {
            for (uint32_t b = 0; b < 256; b++) { t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF]; }
        }
    }
};
inline constexpr Crc32Tables kCrc32Tables{};

// The CRC-32 of `n` more bytes at `data`, continuing `crc` (0 to start), as zlib.crc32(data, crc):
// crc32_update(crc32_update(0, a), b) == crc32 of a followed by b. The 16-byte blocks are read as
// four little-endian words.
inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    const uint32_t(*t)[256] = kCrc32Tables.t;
    const unsigned char* p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (; n >= 16; p += 16, n -= 16) {
        uint32_t w[4];
        memcpy(w, p, 16);
        w[0] ^= crc;
        crc = t[15][w[0] & 0xFF] ^ t[14][(w[0] >> 8) & 0xFF] ^ t[13][(w[0] >> 16) & 0xFF] ^ t[12][w[0] >> 24] ^
              t[11][w[1] & 0xFF] ^ t[10][(w[1] >> 8) & 0xFF] ^ t[9][(w[1] >> 16) & 0xFF] ^ t[8][w[1] >> 24] ^
              t[7][w[2] & 0xFF] ^ t[6][(w[2] >> 8) & 0xFF] ^ t[5][(w[2] >> 16) & 0xFF] ^ t[4][w[2] >> 24] ^
              t[3][w[3] & 0xFF] ^ t[2][(w[3] >> 8) & 0xFF] ^ t[1][(w[3] >> 16) & 0xFF] ^ t[0][w[3] >> 24];
    }
    for (; n > 0; p++, n--) { crc = t[0][(crc ^ *p) & 0xFF] ^ (crc >> 8); }
    return ~crc;
}

inline uint32_t crc32(const void* data, size_t n) { return crc32_update(0, data, n); }

// The CRC-32 of bytes [from, to) of an open file (anything with seek(offset) and read(dst, n,
// what), as CheckedFile in llmc/utils.h), continuing `crc` (0 to start), read in 1 MiB pieces so
// that a file of any size costs no memory. Leaves the file at `to`.
template <typename File>
inline uint32_t crc32_of_file_range(File& f, long from, long to, const char* what, uint32_t crc = 0) {
    f.seek(from);
    std::vector<unsigned char> buf((size_t)std::min<long>(std::max<long>(to - from, 0), 1l << 20));
    uint32_t c = crc;
    for (long left = to - from; left > 0;) {
        size_t n = (size_t)std::min<long>(left, (long)buf.size());
        f.read(buf.data(), n, what);
        c = crc32_update(c, buf.data(), n);
        left -= (long)n;
    }
    return c;
}

// The CRC-32 of a file with a 1024-byte header of int32s whose int `slot` holds the CRC: every
// byte but that int's four (the tokenizer and eval-set files: their header fields are covered
// too, so a changed bos id is caught like a changed piece). `header` is the file's first 1024 bytes.
template <typename File>
inline uint32_t crc32_without_slot(File& f, const int32_t* header, int slot, long size, const char* what) {
    const unsigned char* h = reinterpret_cast<const unsigned char*>(header);
    uint32_t c = crc32_update(crc32(h, 4 * (size_t)slot), h + 4 * slot + 4, 1024 - 4 * (size_t)slot - 4);
    return crc32_of_file_range(f, 1024, size, what, c);
}
