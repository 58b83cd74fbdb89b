/*
The attn.c tensor container: model checkpoints (kind 1), debug states (kind 2). A header with
magic "ATTNFILE", version and kind, the config as "key=value\n" text, a table of named tensors
(fp32, bf16 or int32, up to 4-D), and the 64-byte-aligned data. TensorFileReader checks a whole
file and hands out config values and tensors by name; TensorFileWriter writes one atomically.
Version 2 carries CRC-32s over the header and each tensor, so a changed byte anywhere is refused,
naming the file and the part; version 1 (no checksums) still reads, with a note. Host-only C++17.
The layout and every check: doc/formats.md "Model checkpoints".
*/
#pragma once

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "llmc/data/crc32.h"  // defines: crc32, crc32_update
#include "llmc/number_text.h"
#include "llmc/utils.h"

constexpr char TENSOR_FILE_MAGIC[8] = {'A', 'T', 'T', 'N', 'F', 'I', 'L', 'E'};
constexpr uint32_t TENSOR_FILE_VERSION = 2;     // what the writer writes
constexpr uint32_t TENSOR_FILE_VERSION_NO_CRC = 1;  // still read: the same layout without checksums
constexpr size_t TENSOR_FILE_HEADER_CRC_AT = 48;  // u32 in the header (version 2)
constexpr size_t TENSOR_ENTRY_CRC_AT = 120;       // u32 in each table entry (version 2)

// The CRC a version-2 header holds: over the header's bytes but the CRC field itself
// ([0, 48) and [52, 64)), then everything between the header and the data (`rest`: the
// config text, the tensor table with each tensor's CRC, the zero padding).
inline uint32_t tensor_file_header_crc(const unsigned char* header64, const unsigned char* rest, size_t rest_bytes) {
    uint32_t c = crc32(header64, TENSOR_FILE_HEADER_CRC_AT);
    c = crc32_update(c, header64 + TENSOR_FILE_HEADER_CRC_AT + 4, 64 - TENSOR_FILE_HEADER_CRC_AT - 4);
    return crc32_update(c, rest, rest_bytes);
}
enum TensorFileKind : uint32_t { TENSOR_FILE_CHECKPOINT = 1, TENSOR_FILE_DEBUG_STATE = 2 };
enum TensorDtype : uint32_t { DTYPE_FP32 = 0, DTYPE_BF16 = 1, DTYPE_INT32 = 2 };

inline size_t dtype_size(uint32_t dtype) { return dtype == DTYPE_BF16 ? 2 : 4; }

struct TensorEntry {
    std::string name;
    uint32_t dtype = DTYPE_FP32;
    std::vector<int64_t> shape;
    std::vector<unsigned char> data;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t s : shape) { n *= s; }
        return n;
    }
};

// Reads and checks a whole file (every offset and size against the header and the file size;
// errors name the file and the problem) and hands out config values and tensors by name.
// Version 2: the header's CRC, each tensor's and the zero padding between tensors are checked.
class TensorFileReader {
public:
    TensorFileReader(const std::string& path, uint32_t expected_kind) : path_(path) {
        CheckedFile f(path, "rb");
        long file_size = f.size();
        if (file_size < 64) { fail("truncated: %ld bytes, shorter than the 64-byte header", file_size); }
        unsigned char header[64];
        f.read(header, 64, "header");
        if (memcmp(header, TENSOR_FILE_MAGIC, 8) != 0) { fail("not an attn.c tensor file (magic is not ATTNFILE)"); }
        uint32_t version = get<uint32_t>(header + 8), kind = get<uint32_t>(header + 12);
        if (version != TENSOR_FILE_VERSION && version != TENSOR_FILE_VERSION_NO_CRC) {
            fail("unsupported version %u (this build reads %u and %u)", version, TENSOR_FILE_VERSION_NO_CRC,
                 TENSOR_FILE_VERSION);
        }
        const bool checksums = version == TENSOR_FILE_VERSION;
        if (kind != expected_kind) {
            fail("is a %s, expected a %s", kind_name(kind), kind_name(expected_kind));
        }
        uint64_t meta_bytes = get<uint64_t>(header + 16), n_tensors = get<uint64_t>(header + 24);
        uint64_t data_offset = get<uint64_t>(header + 32), data_bytes = get<uint64_t>(header + 40);
        // (each sum is bounded first, so none can wrap around)
        if (meta_bytes > (uint64_t)file_size || n_tensors > (uint64_t)file_size / 128 ||
            data_offset > (uint64_t)file_size || data_offset < 64 + meta_bytes + 128 * n_tensors ||
            data_offset % 64 != 0 || data_bytes != (uint64_t)file_size - data_offset) {
            fail("inconsistent header: meta %" PRIu64 " bytes, %" PRIu64 " tensors, data at %" PRIu64 " + %" PRIu64
                 " bytes, file %ld bytes (truncated or corrupt)",
                 meta_bytes, n_tensors, data_offset, data_bytes, file_size);
        }
        // the reserved bytes are zero: in version 1 all 16, in version 2 those after the CRC (a
        // version-2 file whose version byte turned into 1 is refused here, not read unchecked)
        const size_t reserved_from = checksums ? TENSOR_FILE_HEADER_CRC_AT + 4 : TENSOR_FILE_HEADER_CRC_AT;
        for (size_t i = reserved_from; i < 64; i++) {
            if (header[i] != 0) { fail("header byte %zu is %u, must be 0 (corrupt header)", i, header[i]); }
        }
        // everything between the header and the data: config text, tensor table, padding
        std::vector<unsigned char> rest(data_offset - 64);
        f.read(rest.data(), rest.size(), "config text and tensor table");
        if (checksums) {
            uint32_t stored = get<uint32_t>(header + TENSOR_FILE_HEADER_CRC_AT);
            uint32_t computed = tensor_file_header_crc(header, rest.data(), rest.size());
            if (stored != computed) {
                fail("checksum mismatch in the header, config text or tensor table: stored CRC32 %08x, computed %08x "
                     "(the file is corrupt)", stored, computed);
            }
        }
        std::string meta(reinterpret_cast<const char*>(rest.data()), meta_bytes);
        parse_config(meta);
        const unsigned char* table = rest.data() + meta_bytes;
        uint64_t cursor = 0;  // version 2: where the next tensor must start (doc/formats.md)
        for (uint64_t t = 0; t < n_tensors; t++) {
            const unsigned char* e = table + 128 * t;
            if (memchr(e, 0, 64) == nullptr) { fail("tensor %" PRIu64 ": name is not NUL-terminated", t); }
            TensorEntry entry;
            entry.name = reinterpret_cast<const char*>(e);
            entry.dtype = get<uint32_t>(e + 64);
            uint32_t ndim = get<uint32_t>(e + 68);
            if (entry.dtype > DTYPE_INT32) { fail("tensor '%s': unknown dtype code %u", entry.name.c_str(), entry.dtype); }
            if (ndim > 4) { fail("tensor '%s': %u dimensions (at most 4)", entry.name.c_str(), ndim); }
            uint64_t offset = get<uint64_t>(e + 104), nbytes = get<uint64_t>(e + 112);
            if (offset % 64 != 0 || offset > data_bytes || nbytes > data_bytes - offset) {
                fail("tensor '%s': data at %" PRIu64 " + %" PRIu64 " lies outside the data section", entry.name.c_str(),
                     offset, nbytes);
            }
            if (checksums && offset != cursor) {
                fail("tensor '%s': data at %" PRIu64 ", expected %" PRIu64 " (tensors follow each other in table order)",
                     entry.name.c_str(), offset, cursor);
            }
            for (size_t i = checksums ? TENSOR_ENTRY_CRC_AT + 4 : TENSOR_ENTRY_CRC_AT; i < 128; i++) {
                if (e[i] != 0) { fail("tensor '%s': table entry byte %zu is %u, must be 0", entry.name.c_str(), i, e[i]); }
            }
            // the byte count of the shape, checked for overflow (a corrupt shape could wrap it
            // around to the stored size, or make numel() negative)
            uint64_t shape_bytes = dtype_size(entry.dtype);
            bool overflow = false;
            for (uint32_t d = 0; d < ndim; d++) {
                uint64_t dim = get<uint64_t>(e + 72 + 8 * d);
                overflow = overflow || dim > (uint64_t)INT64_MAX || __builtin_mul_overflow(shape_bytes, dim, &shape_bytes);
                entry.shape.push_back((int64_t)dim);
            }
            check_unused_shape_slots(entry.name, e, ndim);
            if (overflow || nbytes != shape_bytes) {
                fail("tensor '%s': %" PRIu64 " bytes do not match its shape and dtype", entry.name.c_str(), nbytes);
            }
            if (index_.count(entry.name)) { fail("tensor '%s' appears twice", entry.name.c_str()); }
            f.seek((long)(data_offset + offset));
            entry.data.resize(nbytes);
            f.read(entry.data.data(), nbytes, ("data of tensor " + entry.name).c_str());
            if (checksums) {
                uint32_t stored = get<uint32_t>(e + TENSOR_ENTRY_CRC_AT), computed = crc32(entry.data.data(), nbytes);
                if (stored != computed) {
                    fail("tensor '%s': checksum mismatch: stored CRC32 %08x, computed %08x (its data are corrupt)",
                         entry.name.c_str(), stored, computed);
                }
                // the padding after it (up to the next tensor or the end) is zero
                cursor = round_up64(offset + nbytes);
                uint64_t pad = std::min<uint64_t>(cursor, data_bytes) - (offset + nbytes);
                unsigned char zeros[64];
                f.read(zeros, pad, "padding");
                for (uint64_t i = 0; i < pad; i++) {
                    if (zeros[i] != 0) { fail("nonzero padding after the data of tensor '%s' (corrupt file)", entry.name.c_str()); }
                }
            }
            index_[entry.name] = tensors_.size();
            tensors_.push_back(std::move(entry));
        }
        if (checksums && cursor != data_bytes) {
            fail("the data section has %" PRIu64 " bytes, its tensors end at %" PRIu64 " (corrupt file)", data_bytes, cursor);
        }
        if (!checksums) {
            fprintf(stderr, "note: '%s' is an attn.c tensor file of version 1, without checksums: its contents are not "
                    "verified (files written now are version 2)\n", path.c_str());
        }
    }

    const std::string& path() const { return path_; }
    bool has_key(const std::string& key) const { return config_.count(key) != 0; }
    const std::string& str(const std::string& key) const {
        auto it = config_.find(key);
        if (it == config_.end()) { fail("missing config key '%s'", key.c_str()); }
        return it->second;
    }
    long long integer(const std::string& key) const {
        const std::string& v = str(key);
        long long x;
        if (!parse_whole_integer(v.c_str(), &x)) { fail("config key '%s': '%s' is not an integer", key.c_str(), v.c_str()); }
        return x;
    }
    // an unsigned 64-bit value (seeds, fingerprints), written in decimal
    uint64_t uint64(const std::string& key) const {
        const std::string& v = str(key);
        uint64_t x;
        if (!parse_whole_unsigned64(v.c_str(), &x)) {
            fail("config key '%s': '%s' is not an unsigned 64-bit integer", key.c_str(), v.c_str());
        }
        return x;
    }
    // an integer that must fit an int (sizes, flags, counts): a larger one is refused, not wrapped
    int int32(const std::string& key) const {
        long long x = integer(key);
        if (x < INT32_MIN || x > INT32_MAX) { fail("config key '%s': %lld does not fit a 32-bit int", key.c_str(), x); }
        return (int)x;
    }
    double real(const std::string& key) const {
        const std::string& v = str(key);
        double x;
        if (!parse_finite_real(v.c_str(), &x)) { fail("config key '%s': '%s' is not a finite number", key.c_str(), v.c_str()); }
        return x;
    }

    bool has_tensor(const std::string& name) const { return index_.count(name) != 0; }
    const TensorEntry& tensor(const std::string& name) const {
        auto it = index_.find(name);
        if (it == index_.end()) { fail("missing tensor '%s'", name.c_str()); }
        return tensors_[it->second];
    }
    // The tensor as floats (fp32 or bf16 stored), checking its element count.
    std::vector<float> floats(const std::string& name, int64_t expected_numel = -1) const {
        const TensorEntry& t = tensor(name);
        check_numel(t, expected_numel);
        std::vector<float> out(t.numel());
        if (t.dtype == DTYPE_FP32) {
            memcpy(out.data(), t.data.data(), t.data.size());
        } else if (t.dtype == DTYPE_BF16) {
            for (int64_t i = 0; i < t.numel(); i++) {
                uint32_t bits = (uint32_t)get<uint16_t>(t.data.data() + 2 * i) << 16;
                memcpy(&out[i], &bits, 4);
            }
        } else {
            fail("tensor '%s' is int32, expected floats", name.c_str());
        }
        return out;
    }
    std::vector<int32_t> ints(const std::string& name, int64_t expected_numel = -1) const {
        const TensorEntry& t = tensor(name);
        check_numel(t, expected_numel);
        if (t.dtype != DTYPE_INT32) { fail("tensor '%s' is not int32", name.c_str()); }
        std::vector<int32_t> out(t.numel());
        memcpy(out.data(), t.data.data(), t.data.size());
        return out;
    }

    template <typename... Args>
    [[noreturn]] void fail(const char* fmt, Args... args) const {
        char message[512];
        if constexpr (sizeof...(Args) == 0) {
            snprintf(message, sizeof(message), "%s", fmt);
        } else {
            snprintf(message, sizeof(message), fmt, args...);
        }
        fatal("file '%s': %s", path_.c_str(), message);
    }

private:
    static uint64_t round_up64(uint64_t x) { return (x + 63) / 64 * 64; }
    template <typename T>
    static T get(const unsigned char* p) {
        T v;
        memcpy(&v, p, sizeof(T));
        return v;
    }
    static const char* kind_name(uint32_t kind) {
        return kind == TENSOR_FILE_CHECKPOINT ? "model checkpoint (kind 1)"
               : kind == TENSOR_FILE_DEBUG_STATE ? "debug state (kind 2)"
                                                 : "file of unknown kind";
    }
    // A table entry's shape slots past its ndim are 0 (doc/formats.md): a value there means the
    // entry is corrupt, or a writer meant more dimensions than it said.
    void check_unused_shape_slots(const std::string& name, const unsigned char* entry, uint32_t ndim) const {
        for (uint32_t d = ndim; d < 4; d++) {
            uint64_t slot = get<uint64_t>(entry + 72 + 8 * d);
            if (slot != 0) {
                fail("tensor '%s': shape slot %u is %" PRIu64 " but the tensor has %u dimensions (slots past them must "
                     "be 0)", name.c_str(), d, slot, ndim);
            }
        }
    }
    void check_numel(const TensorEntry& t, int64_t expected) const {
        if (expected >= 0 && t.numel() != expected) {
            fail("tensor '%s' has %lld elements, expected %lld", t.name.c_str(), (long long)t.numel(),
                 (long long)expected);
        }
    }
    void parse_config(const std::string& meta) {
        size_t pos = 0;
        while (pos < meta.size()) {
            size_t nl = meta.find('\n', pos);
            if (nl == std::string::npos) { fail("config text does not end with a newline"); }
            std::string line = meta.substr(pos, nl - pos);
            size_t eq = line.find('=');
            if (eq == std::string::npos || eq == 0) { fail("config line '%s' is not key=value", line.c_str()); }
            config_[line.substr(0, eq)] = line.substr(eq + 1);
            pos = nl + 1;
        }
    }

    std::string path_;
    std::map<std::string, std::string> config_;
    std::vector<TensorEntry> tensors_;
    std::map<std::string, size_t> index_;
};

// Collects config keys and tensors and writes them atomically (temp file + rename), so an
// interrupted save never replaces a good file. Writes version 2, with its CRC-32s
// (llmc/data/crc32.h, zlib's): one in the header over the header, config text, tensor table and
// the padding before the data, one per tensor over its data.
class TensorFileWriter {
public:
    explicit TensorFileWriter(uint32_t kind) : kind_(kind) {}

    void set(const std::string& key, const std::string& value) { config_.emplace_back(key, value); }
    const std::vector<std::pair<std::string, std::string>>& config() const { return config_; }  // in set() order
    void set(const std::string& key, long long value) { set(key, std::to_string(value)); }
    void set(const std::string& key, int value) { set(key, std::to_string(value)); }
    void set(const std::string& key, double value) { set(key, shortest_real_text(value)); }
    void add_floats(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
        add(name, DTYPE_FP32, shape, data);
    }
    void add_ints(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
        add(name, DTYPE_INT32, shape, data);
    }

    void write(const std::string& path) const {
        uint64_t meta_bytes = 0;
        for (const auto& kv : config_) { meta_bytes += kv.first.size() + kv.second.size() + 2; }
        uint64_t data_offset = round_up(64 + meta_bytes + 128 * tensors_.size());
        std::vector<uint64_t> offsets;
        uint64_t cursor = 0;
        for (const auto& t : tensors_) {
            offsets.push_back(cursor);
            cursor = round_up(cursor + t.data.size());
        }
        uint64_t data_bytes = cursor;

        // everything between the header and the data (config text, tensor table, padding),
        // assembled first: the header's CRC covers it
        std::vector<unsigned char> rest;
        rest.reserve(data_offset - 64);
        for (const auto& kv : config_) {
            std::string line = kv.first + "=" + kv.second + "\n";
            rest.insert(rest.end(), line.begin(), line.end());
        }
        for (size_t i = 0; i < tensors_.size(); i++) {
            const TensorEntry& t = tensors_[i];
            unsigned char e[128] = {};
            memcpy(e, t.name.data(), t.name.size());
            put<uint32_t>(e + 64, t.dtype);
            put<uint32_t>(e + 68, (uint32_t)t.shape.size());
            for (size_t d = 0; d < t.shape.size(); d++) { put<uint64_t>(e + 72 + 8 * d, (uint64_t)t.shape[d]); }
            put<uint64_t>(e + 104, offsets[i]);
            put<uint64_t>(e + 112, t.data.size());
            put<uint32_t>(e + TENSOR_ENTRY_CRC_AT, crc32(t.data.data(), t.data.size()));
            rest.insert(rest.end(), e, e + 128);
        }
        rest.resize(data_offset - 64, 0);
        unsigned char header[64] = {};
        memcpy(header, TENSOR_FILE_MAGIC, 8);
        put<uint32_t>(header + 8, TENSOR_FILE_VERSION);
        put<uint32_t>(header + 12, kind_);
        put<uint64_t>(header + 16, meta_bytes);
        put<uint64_t>(header + 24, tensors_.size());
        put<uint64_t>(header + 32, data_offset);
        put<uint64_t>(header + 40, data_bytes);
        put<uint32_t>(header + TENSOR_FILE_HEADER_CRC_AT, tensor_file_header_crc(header, rest.data(), rest.size()));

        AtomicFileWriter out(path);
        CheckedFile& f = out.file();
        f.write(header, 64, "header");
        f.write(rest.data(), rest.size(), "config text and tensor table");
        std::vector<unsigned char> zeros(64, 0);
        for (size_t i = 0; i < tensors_.size(); i++) {
            const TensorEntry& t = tensors_[i];
            f.write(t.data.data(), t.data.size(), ("data of tensor " + t.name).c_str());
            uint64_t end = (i + 1 < tensors_.size() ? offsets[i + 1] : data_bytes);
            f.write(zeros.data(), end - offsets[i] - t.data.size(), "padding");
        }
        out.commit();
    }

private:
    static uint64_t round_up(uint64_t x) { return (x + 63) / 64 * 64; }
    template <typename T>
    static void put(unsigned char* p, T v) { memcpy(p, &v, sizeof(T)); }
    void add(const std::string& name, uint32_t dtype, const std::vector<int64_t>& shape, const void* data) {
        if (name.empty() || name.size() > 63) { fatal("tensor name '%s' must have 1 to 63 characters", name.c_str()); }
        TensorEntry t;
        t.name = name;
        t.dtype = dtype;
        t.shape = shape;
        t.data.resize((size_t)t.numel() * dtype_size(dtype));
        memcpy(t.data.data(), data, t.data.size());
        tensors_.push_back(std::move(t));
    }

    uint32_t kind_;
    std::vector<std::pair<std::string, std::string>> config_;
    std::vector<TensorEntry> tensors_;
};
