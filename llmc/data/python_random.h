/*
PythonRandom: the numbers of CPython's `random.Random(seed).random()` for a non-negative
integer seed below 2^64, so that a draw a Python script makes with the `random` module (the SAN
paper's eval code seeds it with 3407) can be made here document for document. Host-only C++17.

The generator is MT19937 (Matsumoto & Nishimura, 1998). Seeding as CPython's random.seed(int):
the seed's 32-bit words, least significant first (one word for seeds below 2^32, also for 0),
go through the generator's init_by_array. random() takes two outputs a, b and returns
((a >> 5) * 2^26 + (b >> 6)) / 2^53, a double in [0, 1) with 53 random bits.
Cost: 2 tempered words per random(); the 624-word state is regenerated every 312 calls.
*/
#pragma once

#include <cstdint>

class PythonRandom {
public:
    explicit PythonRandom(uint64_t seed) {
        const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
        seed_with_key(key, (seed >> 32) != 0 ? 2 : 1);
    }

    // random.random(): uniform in [0, 1)
    double random() {
        const uint32_t a = next_word() >> 5, b = next_word() >> 6;
        return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
    }

    uint32_t next_word() {
        if (index_ >= kN) { regenerate(); }
        uint32_t y = state_[index_++];
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C5680u;
        y ^= (y << 15) & 0xEFC60000u;
        return y ^ (y >> 18);
    }

private:
    static constexpr int kN = 624, kM = 397;
    uint32_t state_[kN];
    int index_ = kN;

    void seed_with_word(uint32_t s) {
        state_[0] = s;
        for (int i = 1; i < kN; i++) { state_[i] = 1812433253u * (state_[i - 1] ^ (state_[i - 1] >> 30)) + (uint32_t)i; }
        index_ = kN;
    }
    // MT19937's init_by_array (the seeding of the generator's 2002 reference)
    void seed_with_key(const uint32_t* key, int length) {
        seed_with_word(19650218u);
        int i = 1, j = 0;
        for (int k = kN > length ? kN : length; k > 0; k--) {
            state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
            i++, j++;
            if (i >= kN) { state_[0] = state_[kN - 1], i = 1; }
            if (j >= length) { j = 0; }
        }
        for (int k = kN - 1; k > 0; k--) {
            state_[i] = (state_[i] ^ ((state_[i - 1] ^ (state_[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
            i++;
            if (i >= kN) { state_[0] = state_[kN - 1], i = 1; }
        }
        state_[0] = 0x80000000u;  // a state that is not all zero
    }
    void regenerate() {
        for (int i = 0; i < kN; i++) {
            const uint32_t y = (state_[i] & 0x80000000u) | (state_[(i + 1) % kN] & 0x7FFFFFFFu);
            state_[i] = state_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908B0DFu : 0u);
        }
        index_ = 0;
    }
};
