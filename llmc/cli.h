/*
Command-line flags for the trainers: every option is `--name value`, has a help line and
shows its current value (the default, before parsing) in `-h`. Unknown options, missing
values and values that do not parse fail with a message naming the option.
Host-only C++17.

    std::vector<Flag> flags = {make_flag("--steps", &steps, "optimizer steps"), ...};
    parse_flags(argc, argv, flags, "train_san");
*/
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "utils.h"

struct Flag {
    std::string name, help;
    std::function<std::string()> show;
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
    f.parse = [target](const char* text) {
        char* end = nullptr;
        if constexpr (std::is_same<T, std::string>::value) {
            *target = text;
            return true;
        } else if constexpr (std::is_floating_point<T>::value) {
            *target = (T)strtod(text, &end);
        } else {
            *target = (T)strtoll(text, &end, 10);
        }
        return end != text && *end == '\0';
    };
    return f;
}

inline void print_usage(const char* program, const std::vector<Flag>& flags) {
    printf("usage: %s [options]   (every option takes a value: --name value)\n\n", program);
    for (const Flag& f : flags) { printf("  %-16s %-14s %s\n", f.name.c_str(), f.show().c_str(), f.help.c_str()); }
    printf("  %-16s %-14s %s\n", "-h, --help", "", "print this and exit");
}

// Applies argv to the flags; -h prints the usage and exits.
inline void parse_flags(int argc, char** argv, const std::vector<Flag>& flags, const char* program) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            print_usage(program, flags);
            exit(EXIT_SUCCESS);
        }
        auto it = std::find_if(flags.begin(), flags.end(), [&](const Flag& f) { return f.name == argv[i]; });
        if (it == flags.end()) { fatal("unknown option '%s' (%s -h lists them)", argv[i], program); }
        if (i + 1 >= argc) { fatal("option %s needs a value", argv[i]); }
        if (!it->parse(argv[i + 1])) { fatal("option %s: cannot parse '%s'", argv[i], argv[i + 1]); }
        i++;
    }
}

// The value given for `name` on the command line, or "" (for flags that must be read
// before the others, such as a preset that sets the defaults).
inline std::string find_flag_value(int argc, char** argv, const char* name) {
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], name) == 0) { return argv[i + 1]; }
    }
    return "";
}

// Parses argv for options whose model config comes from a named preset (o.preset, o.model):
// --preset first, since it sets the defaults the other flags override, then every flag.
// `set_defaults(o)` runs between the two, for other switches that set defaults.
template <typename Options, typename Presets, typename MakeFlags, typename SetDefaults>
Options parse_with_preset(int argc, char** argv, const Presets& presets, MakeFlags make_flags, const char* program,
                          SetDefaults set_defaults) {
    Options o;
    std::string preset = find_flag_value(argc, argv, "--preset");
    if (!preset.empty()) { o.preset = preset; }
    auto it = presets.find(o.preset);
    if (it == presets.end()) { fatal("--preset: unknown preset '%s' (%s -h lists them)", o.preset.c_str(), program); }
    o.model = it->second;
    set_defaults(o);
    parse_flags(argc, argv, make_flags(o), program);
    return o;
}
template <typename Options, typename Presets, typename MakeFlags>
Options parse_with_preset(int argc, char** argv, const Presets& presets, MakeFlags make_flags, const char* program) {
    return parse_with_preset<Options>(argc, argv, presets, make_flags, program, [](Options&) {});
}
