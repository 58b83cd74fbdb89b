/*
Command-line flags for the trainers: every option is `--name value` (or `--name=value`),
has a help line and shows its current value (the default, before parsing) in `-h`.
Unknown options, missing values and values that do not parse fail with a message naming
the option; a stray word after an option's value (what an unquoted glob becomes once the
shell expands it) gets a hint to quote the pattern. parse_flags returns the names of the
flags given, so a trainer can tell a value given from a default (resuming a run).
Host-only C++17.

    std::vector<Flag> flags = {make_flag("--steps", &steps, "optimizer steps"), ...};
    std::set<std::string> given = parse_flags(argc, argv, flags, "train_san");
*/
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "choices.h"
#include "llmc/number_text.h"
#include "utils.h"

struct Flag {
    std::string name, help;
    std::function<std::string()> show;   // the value as -h shows it
    std::function<std::string()> text;   // the value as text that parses back to it exactly (config files)
    std::function<bool(const char*)> parse;
};

template <typename T>
Flag make_flag(const std::string& name, T* target, const std::string& help) {
    Flag f;
    f.name = name;
    f.help = help;
    f.show = [target]() {
        if constexpr (std::is_same<T, std::string>::value) {
            return target->empty() ? std::string("\"\"") : *target;
        } else {
            char text[64];
            if constexpr (std::is_floating_point<T>::value) {
                snprintf(text, sizeof(text), "%g", (double)*target);
            } else {
                snprintf(text, sizeof(text), "%lld", (long long)*target);
            }
            return std::string(text);
        }
    };
    f.text = [target]() {
        if constexpr (std::is_same<T, std::string>::value) {
            return *target;
        } else if constexpr (std::is_floating_point<T>::value) {
            if (*target == std::floor(*target) && std::fabs(*target) < 1e15) {  // 10000, not 1e+04
                char whole[32];
                snprintf(whole, sizeof(whole), "%.0f", (double)*target);
                return std::string(whole);
            }
            if constexpr (std::is_same<T, float>::value) { return shortest_float_text(*target); }
            return shortest_real_text((double)*target);
        } else {
            return std::to_string(*target);
        }
    };
    // numbers are read strictly (llmc/number_text.h): the whole text, finite, and within the
    // option's type; a value out of range is refused here, naming the option, not wrapped
    f.parse = [name, target](const char* text) {
        if constexpr (std::is_same<T, std::string>::value) {
            *target = text;
        } else if constexpr (std::is_floating_point<T>::value) {
            double x;
            if (!parse_finite_real(text, &x)) { fatal("option %s: '%s' is not a finite number", name.c_str(), text); }
            if (std::fabs(x) > (double)std::numeric_limits<T>::max()) { fatal("option %s: %s is too large", name.c_str(), text); }
            *target = (T)x;
        } else if constexpr (std::is_unsigned<T>::value) {
            uint64_t x;
            if (!parse_whole_unsigned64(text, &x)) { fatal("option %s: '%s' is not a non-negative integer", name.c_str(), text); }
            if (x > (uint64_t)std::numeric_limits<T>::max()) { fatal("option %s: %s is too large", name.c_str(), text); }
            *target = (T)x;
        } else {
            long long x;
            if (!parse_whole_integer(text, &x)) { fatal("option %s: '%s' is not an integer", name.c_str(), text); }
            if (x < (long long)std::numeric_limits<T>::min() || x > (long long)std::numeric_limits<T>::max()) {
                fatal("option %s: %s is out of range (%lld to %lld)", name.c_str(), text,
                      (long long)std::numeric_limits<T>::min(), (long long)std::numeric_limits<T>::max());
            }
            *target = (T)x;
        }
        return true;
    };
    return f;
}

// A flag for a setting with fixed values: parses a name into the enum (a name it does not
// know fails, listing the names); -h shows the name and appends the names to the help.
template <typename E>
Flag make_flag(const std::string& name, E* target, const Choices<E>& choices, const std::string& help) {
    Flag f;
    f.name = name;
    f.help = choices.list() + (help.empty() ? "" : " (" + help + ")");
    f.show = [target, &choices]() { return std::string(choices.name(*target)); };
    f.text = f.show;
    f.parse = [name, target, &choices](const char* text) {
        if (!choices.parse(text, target)) { fatal("option %s: '%s' is not one of %s", name.c_str(), text, choices.list(", ").c_str()); }
        return true;
    };
    return f;
}

// `note`: lines printed under the usage line (e.g. which preset the defaults column shows);
// `after`: lines printed after the options (e.g. the presets' sizes). The columns are as wide
// as the longest name and default (a default longer than 24 characters runs into the help).
inline void print_usage(const char* program, const std::vector<Flag>& flags, const std::string& note = "",
                        const std::string& after = "") {
    printf("usage: %s [options]   (every option takes a value: --name value or --name=value)\n", program);
    if (!note.empty()) { printf("%s", note.c_str()); }
    int name_width = (int)strlen("-h, --help"), show_width = (int)strlen("default");
    for (const Flag& f : flags) {
        name_width = std::max(name_width, (int)f.name.size());
        show_width = std::max(show_width, std::min(24, (int)f.show().size()));
    }
    printf("\n  %-*s %-*s\n", name_width, "option", show_width, "default");
    for (const Flag& f : flags) {
        printf("  %-*s %-*s %s\n", name_width, f.name.c_str(), show_width, f.show().c_str(), f.help.c_str());
    }
    printf("  %-*s %-*s %s\n", name_width, "-h, --help", show_width, "", "print this and exit");
    if (!after.empty()) { printf("\n%s", after.c_str()); }
}

// argv[i] split into (name, inline value) for `--name=value`; has_value says whether there was one.
struct FlagWord {
    std::string name, value;
    bool has_value = false;
};
inline FlagWord split_flag_word(const char* word) {
    FlagWord w;
    w.name = word;
    size_t eq = w.name.find('=');
    if (w.name.rfind("--", 0) == 0 && eq != std::string::npos) {
        w.value = w.name.substr(eq + 1);
        w.name = w.name.substr(0, eq);
        w.has_value = true;
    }
    return w;
}

// Edit distance between a and b counting a swap of two neighbours as one edit (optimal string
// alignment): --stpes is 1 from --steps.
inline size_t flag_edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); i++) { d[i][0] = i; }
    for (size_t j = 0; j <= b.size(); j++) { d[0][j] = j; }
    for (size_t i = 1; i <= a.size(); i++) {
        for (size_t j = 1; j <= b.size(); j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
            }
        }
    }
    return d[a.size()][b.size()];
}

// " (did you mean --steps?)" for a name within 2 edits of exactly one nearest flag (and closer
// than a third of its length), else "".
inline std::string nearest_flag_hint(const std::string& name, const std::vector<Flag>& flags) {
    size_t best = SIZE_MAX;
    const Flag* nearest = nullptr;
    bool tie = false;
    for (const Flag& f : flags) {
        size_t d = flag_edit_distance(name, f.name);
        if (d < best) {
            best = d;
            nearest = &f;
            tie = false;
        } else if (d == best) {
            tie = true;
        }
    }
    if (nearest == nullptr || tie || best > 2 || 3 * best >= nearest->name.size()) { return ""; }
    return " (did you mean " + nearest->name + "?)";
}

// Applies argv to the flags; -h prints the usage (with `note` and `after`) and exits. Returns the
// names of the flags given.
inline std::set<std::string> parse_flags(int argc, char** argv, const std::vector<Flag>& flags, const char* program,
                                         const std::string& note = "", const std::string& after = "") {
    std::set<std::string> given;
    std::string previous;  // the last option and its value, for the unquoted-glob hint
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            print_usage(program, flags, note, after);
            exit(EXIT_SUCCESS);
        }
        FlagWord w = split_flag_word(argv[i]);
        auto it = std::find_if(flags.begin(), flags.end(), [&](const Flag& f) { return f.name == w.name; });
        if (it == flags.end()) {
            if (w.name.rfind("-", 0) != 0 && !previous.empty()) {
                fatal("unexpected argument '%s' after %s: an unquoted glob? The shell expands a pattern into file "
                      "names; quote it, e.g. --train-data \"data/offline/synth/synth_train_*.bin\"", argv[i],
                      previous.c_str());
            }
            fatal("unknown option '%s'%s (%s -h lists them)", argv[i], nearest_flag_hint(w.name, flags).c_str(), program);
        }
        std::string value;
        if (w.has_value) {
            value = w.value;
        } else {
            if (i + 1 >= argc) { fatal("option %s needs a value", argv[i]); }
            value = argv[++i];
        }
        if (!it->parse(value.c_str())) { fatal("option %s: cannot parse '%s'", w.name.c_str(), value.c_str()); }
        given.insert(w.name);
        previous = w.name + " '" + value + "'";
    }
    return given;
}

// Whether the command line asks for the usage (-h or --help).
inline bool help_asked(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) { return true; }
    }
    return false;
}

// The value given for `name` on the command line, or "" (for flags that must be read
// before the others, such as a preset that sets the defaults): the last one given, as
// parse_flags keeps it (a config file's settings come first: llmc/config_file.h).
inline std::string find_flag_value(int argc, char** argv, const char* name) {
    std::string value;
    for (int i = 1; i < argc; i++) {
        FlagWord w = split_flag_word(argv[i]);
        if (w.name != name) { continue; }
        if (w.has_value) {
            value = w.value;
        } else if (i + 1 < argc) {
            value = argv[++i];
        }
    }
    return value;
}

// Parses argv for options whose model config comes from a named preset (o.preset, o.model):
// --preset first, since it sets the defaults the other flags override, then every flag;
// the flags given go to o.train.given. `set_defaults(o)` runs between the two, for other
// switches that set defaults. `after`: what -h prints after the options (the presets' sizes).
template <typename Options, typename Presets, typename MakeFlags, typename SetDefaults>
Options parse_with_preset(int argc, char** argv, const Presets& presets, MakeFlags make_flags, const char* program,
                          SetDefaults set_defaults, const std::string& after = "") {
    Options o;
    std::string preset = find_flag_value(argc, argv, "--preset");
    if (!preset.empty()) { o.preset = preset; }
    auto it = presets.find(o.preset);
    if (it == presets.end()) {
        std::string names;
        for (const auto& kv : presets) { names += (names.empty() ? "" : ", ") + kv.first; }
        fatal("--preset: unknown preset '%s' (presets: %s)", o.preset.c_str(), names.c_str());
    }
    o.model = it->second;
    set_defaults(o);
    std::string note = "The defaults column shows the model values of preset '" + o.preset + "'" +
                       (preset.empty() ? " (the default preset; --preset NAME -h shows another's)" : "") +
                       ".\n--tokenizer FILE sets the vocabulary size (--vocab-size) to the tokenizer's.\n";
    std::set<std::string> given = parse_flags(argc, argv, make_flags(o), program, note, after);
    o.train.given.insert(given.begin(), given.end());  // (set_defaults may have added some)
    return o;
}
template <typename Options, typename Presets, typename MakeFlags>
Options parse_with_preset(int argc, char** argv, const Presets& presets, MakeFlags make_flags, const char* program) {
    return parse_with_preset<Options>(argc, argv, presets, make_flags, program, [](Options&) {});
}
