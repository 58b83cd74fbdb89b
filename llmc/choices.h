/*
Settings with a fixed set of values (--ffn none|swiglu, --optimizer adamw|muon, ...): an
enum whose values are 0..N-1 and the names that flags and files use for them, in that
order. The name becomes the enum where it comes in (llmc/cli.h make_flag, a config's
read_config) and the name again where it goes out (-h, checkpoints); everything between
compares enums, never strings. Host-only C++17.

    enum class NormKind { ZCN, RMS };
    inline const Choices<NormKind> kNormKinds{{"zcn", "rms"}};
    kNormKinds.name(NormKind::RMS) == std::string("rms");   kNormKinds.parse("rms", &kind)
*/
#pragma once

#include <string>
#include <vector>

template <typename E>
struct Choices {
    std::vector<const char*> names;  // names[i] for the enum value i

    const char* name(E value) const { return names[(size_t)value]; }
    bool parse(const std::string& text, E* value) const {
        for (size_t i = 0; i < names.size(); i++) {
            if (text == names[i]) {
                *value = (E)i;
                return true;
            }
        }
        return false;
    }
    std::string list(const char* separator = " | ") const {  // "a | b | c", for help lines and errors
        std::string out;
        for (size_t i = 0; i < names.size(); i++) { out += (i > 0 ? separator : "") + std::string(names[i]); }
        return out;
    }
};

// The value a file's key names (a TensorFileReader's str(key)); a name this build does not
// know fails, naming the file and the key.
template <typename Reader, typename E>
void read_choice(const Reader& r, const std::string& key, const Choices<E>& choices, E* value) {
    const std::string text = r.str(key);
    if (!choices.parse(text, value)) {
        r.fail("key %s: '%s' is not one of %s", key.c_str(), text.c_str(), choices.list(", ").c_str());
    }
}
