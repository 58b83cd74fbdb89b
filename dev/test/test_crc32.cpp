/*
Tests llmc/data/crc32.h, the CRC-32 our checksummed files carry, against zlib's:
  - the standard check value crc32("123456789") = 0xCBF43926;
  - buffers of 0 to 65,537 bytes drawn from splitmix64, whose CRCs were computed by Python's
    zlib.crc32 (the snippet below prints them), so the C++ and the Python side agree;
  - a bit-at-a-time CRC written from the polynomial's definition, on random lengths and
    start addresses (every alignment), and crc32_update split at every point of a buffer
    (continuing a CRC is the same as one CRC over the whole).
It also prints the speed of slicing-by-16 next to the one-table byte loop on 64 MiB, the
figure that says whether a checkpoint or shard read pays for its check (doc/formats.md).

The zlib values (Python):
    M = 2**64 - 1
    def splitmix_bytes(seed, n):   # the low byte of each splitmix64 output
        s, out = seed, bytearray()
        for _ in range(n):
            s = (s + 0x9E3779B97F4A7C15) & M
            z = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & M
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
            out.append((z ^ (z >> 31)) & 0xFF)
        return bytes(out)
    zlib.crc32(splitmix_bytes(seed, n))
*/
#include <chrono>
#include <cstdio>
#include <vector>

#include "dev/test/data_test_util.h"  // defines: CHECK, report
#include "llmc/data/crc32.h"          // defines: crc32, crc32_update, kCrc32Tables
#include "llmc/data/dataloader.h"     // defines: SplitMix64

static std::vector<unsigned char> splitmix_bytes(uint64_t seed, size_t n) {
    SplitMix64 r(seed);
    std::vector<unsigned char> b(n);
    for (size_t i = 0; i < n; i++) { b[i] = (unsigned char)(r.next() & 0xFF); }
    return b;
}

// the CRC from its definition: shift each bit through the reflected polynomial
static uint32_t crc32_bitwise(const unsigned char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) { c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1))); }
    }
    return ~c;
}

// the classic one-table byte loop, for the speed comparison
static uint32_t crc32_bytewise(const unsigned char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) { c = kCrc32Tables.t[0][(c ^ p[i]) & 0xFF] ^ (c >> 8); }
    return ~c;
}

int main() {
    CHECK(crc32("123456789", 9) == 0xCBF43926u);
    CHECK(crc32("", 0) == 0u);

    struct { uint64_t seed; size_t n; uint32_t zlib; } vectors[] = {
        {1, 0, 0x0u},          {2, 1, 0xaede003au},   {3, 7, 0xa68fe362u},    {4, 8, 0xdccef912u},
        {5, 9, 0x276f13a4u},   {6, 63, 0xcbbe6a95u},  {7, 64, 0xba5d2da6u},   {8, 1000, 0x6f4bb7f3u},
        {9, 4097, 0x8ca1ec2bu}, {10, 65537, 0x36dc3304u},
    };
    for (const auto& v : vectors) {
        std::vector<unsigned char> b = splitmix_bytes(v.seed, v.n);
        uint32_t got = crc32(b.data(), b.size());
        if (got != v.zlib) { fprintf(stderr, "seed %llu, %zu bytes: %08x, zlib %08x\n", (unsigned long long)v.seed, v.n, got, v.zlib); }
        CHECK(got == v.zlib);
    }

    // random lengths at every start address modulo 8, against the definition
    std::vector<unsigned char> big = splitmix_bytes(99, 5000);
    SplitMix64 r(3);
    int mismatches = 0;
    for (int i = 0; i < 400; i++) {
        size_t at = r.below(64), n = r.below(big.size() - at);
        if (crc32(big.data() + at, n) != crc32_bitwise(big.data() + at, n)) { mismatches++; }
    }
    CHECK(mismatches == 0);

    // crc32_update split at every point is one CRC over the whole
    const size_t n = 300;
    const uint32_t whole = crc32(big.data(), n);
    int split_mismatches = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        if (crc32_update(crc32(big.data(), cut), big.data() + cut, n - cut) != whole) { split_mismatches++; }
    }
    CHECK(split_mismatches == 0);

    // speed on 64 MiB (printed, not checked: machines differ)
    std::vector<unsigned char> huge(64u << 20);
    for (size_t i = 0; i < huge.size(); i++) { huge[i] = (unsigned char)(i * 2654435761u >> 13); }
    auto seconds = [](auto f) {
        auto t0 = std::chrono::steady_clock::now();
        volatile uint32_t c = f();
        (void)c;
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    uint32_t a = 0, b = 0;
    double fast = seconds([&] { return a = crc32(huge.data(), huge.size()); });
    double slow = seconds([&] { return b = crc32_bytewise(huge.data(), huge.size()); });
    CHECK(a == b);
    printf("crc32 of 64 MiB: slicing-by-16 %.0f MB/s, one table %.0f MB/s\n", huge.size() / fast / 1e6,
           huge.size() / slow / 1e6);
    return report("test_crc32");
}
