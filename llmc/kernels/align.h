/*
aligned16({p, q, ...}): true when every pointer is 16-byte aligned (null counts as
aligned), i.e. when a kernel may use 128-bit loads and stores (x128) on all of them.
Used by the elementwise launchers to choose their vector path. Host-side, header-only.
*/
#pragma once

#include <cstdint>
#include <initializer_list>

inline bool aligned16(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers) {
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) { return false; }
    }
    return true;
}
