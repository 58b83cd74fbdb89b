/*
Presets and recipes as data: presets/NAME.conf (a train_san model preset), presets/gpt2/NAME.conf
(a train_gpt2 one), presets/recipes/NAME.conf (a recipe such as --paper-setup) and
presets/rates/NAME.conf (default rates per arm), in the `key = value` format of --config. The
Makefile writes their text into build/generated/preset_files.inc, which this header compiles in,
so a binary reads no file at run time; the Python side reads the same files (attnref/presets.py).
A key that names a flag sets it (apply_setting); the other keys are the file's own, read by the
trainer. Host-only C++17. The format: doc/formats.md "Config files"; the rates: doc/san-model.md.
*/
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "llmc/cli.h"
#include "llmc/config_file.h"
#include "llmc/optim/optimizer.h"  // DefaultRates
#include "llmc/utils.h"

#if !__has_include("build/generated/preset_files.inc")
#error "build/generated/preset_files.inc is missing: build with make, which writes it from presets/**/*.conf"
#endif

// One compiled-in file: its path in the repository (presets/demo.conf) and its settings. Keys that
// name no flag are the file's own: a preset's swept-* rates, a recipe's resume-keeps, a rates
// file's keys (presets/rates/san-paper.conf: the SAN paper's locked rates).
struct ConfigFile {
    std::string path;
    std::vector<ConfigEntry> entries;

    // "demo" of presets/demo.conf
    std::string name() const {
        const size_t slash = path.rfind('/'), dot = path.rfind(".conf");
        return path.substr(slash + 1, dot - slash - 1);
    }
    const ConfigEntry* find(const std::string& key) const {
        for (const ConfigEntry& e : entries) {
            if (e.key == key) { return &e; }
        }
        return nullptr;
    }
    // a number of the file's own (not a flag), e.g. a preset's swept-muon
    double real(const ConfigEntry& e) const {
        double x;
        if (!parse_finite_real(e.value.c_str(), &x)) {
            fatal("%s line %d: %s = '%s' is not a finite number", path.c_str(), e.line, e.key.c_str(), e.value.c_str());
        }
        return x;
    }
};

// Every compiled-in file, parsed once (a file that does not parse fails at start, naming its line).
inline const std::vector<ConfigFile>& compiled_config_files() {
    struct Text {
        const char* path;
        const char* text;
    };
    static const Text kTexts[] = {
#include "build/generated/preset_files.inc"
    };
    static const std::vector<ConfigFile> files = [] {
        std::vector<ConfigFile> out;
        for (const Text& t : kTexts) { out.push_back({t.path, parse_config_text(t.text, t.path)}); }
        return out;
    }();
    return files;
}

// The compiled-in files under `folder` ("presets/" for the presets: not its recipes/ folder).
inline std::vector<const ConfigFile*> compiled_config_files_in(const std::string& folder) {
    std::vector<const ConfigFile*> out;
    for (const ConfigFile& f : compiled_config_files()) {
        const bool inside = f.path.rfind(folder, 0) == 0 && f.path.find('/', folder.size()) == std::string::npos;
        if (inside) { out.push_back(&f); }
    }
    return out;
}

// --preset's help: the names of the presets in `folder`, from the files compiled in, so that a new
// presets/NAME.conf is listed without an edit here.
inline std::string preset_flag_help(const std::string& folder) {
    std::set<std::string> sorted;  // by name: "tiny" before "tiny-ffn", which the files' paths do not give
    for (const ConfigFile* f : compiled_config_files_in(folder)) { sorted.insert(f->name()); }
    std::string names;
    for (const std::string& name : sorted) { names += (names.empty() ? "" : ", ") + name; }
    return "model preset: " + names + "; each is " + folder + "NAME.conf (sizes and rates under the options), the flags below override it";
}

// The file compiled in from `path`, e.g. compiled_config_file("presets/demo.conf").
inline const ConfigFile& compiled_config_file(const std::string& path) {
    for (const ConfigFile& f : compiled_config_files()) {
        if (f.path == path) { return f; }
    }
    fatal("%s is not compiled into this binary (the Makefile compiles presets/*.conf and presets/{gpt2,recipes,rates}/*.conf "
          "in)", path.c_str());
}

// Sets the flag that `e` names to its value; an unknown key or a bad value fails naming the file
// and the line. Returns the flag's name (--key).
inline std::string apply_setting(const ConfigFile& f, const ConfigEntry& e, const std::vector<Flag>& flags) {
    const std::string name = "--" + e.key;
    auto it = std::find_if(flags.begin(), flags.end(), [&](const Flag& flag) { return flag.name == name; });
    if (it == flags.end()) {
        fatal("%s line %d: unknown setting '%s'%s", f.path.c_str(), e.line, e.key.c_str(),
              nearest_flag_hint(name, flags).c_str());
    }
    const std::string where = f.path + " line " + std::to_string(e.line);
    FatalContext context(where, where);
    it->parse(e.value.c_str());
    return name;
}

// Reads a model preset into the config that `flags` point into: a key that `own` takes (a key of
// the file's own, such as a SAN preset's swept-* rates) goes there, every other key sets the flag it
// names, and the file must set every flag of `flags` exactly once, so that a preset is its file
// alone (no default of the config shows through). Fails naming the file (and line); `trainer`
// names the binary whose -h lists the flags.
inline void read_model_preset(const ConfigFile& f, const std::vector<Flag>& flags, const char* trainer,
                              const std::function<bool(const ConfigEntry&)>& own = nullptr) {
    std::set<std::string> keys, set_here;
    for (const ConfigEntry& e : f.entries) {
        if (!keys.insert(e.key).second) { fatal("%s line %d: %s is set twice in the file", f.path.c_str(), e.line, e.key.c_str()); }
        if (own == nullptr || !own(e)) { set_here.insert(apply_setting(f, e, flags)); }
    }
    for (const Flag& flag : flags) {
        if (!set_here.count(flag.name)) {
            fatal("%s sets no %s: a preset sets every model flag (%s -h lists them)", f.path.c_str(), flag.name.c_str() + 2,
                  trainer);
        }
    }
}

// The default rates of `arm` in a rates file (presets/rates/NAME.conf): ARM-source, ARM-adamw and,
// for a trainer with Muon, ARM-muon and ARM-muon-other (absent: -1). Every key of the file must be
// ARM-source, -muon, -muon-other or -adamw, and an arm needs its source and AdamW rate; otherwise it
// fails naming the file (and line).
inline DefaultRates compiled_default_rates(const std::string& path, const std::string& arm) {
    const ConfigFile& f = compiled_config_file(path);
    std::map<std::string, std::map<std::string, const ConfigEntry*>> arms;  // {arm: {field: entry}}
    for (const ConfigEntry& e : f.entries) {
        std::string field;
        for (const std::string suffix : {"-source", "-muon-other", "-muon", "-adamw"}) {
            const bool ends = e.key.size() > suffix.size() && e.key.compare(e.key.size() - suffix.size(), suffix.size(), suffix) == 0;
            if (field.empty() && ends) { field = suffix.substr(1); }
        }
        if (field.empty()) {
            fatal("%s line %d: unknown key '%s' (a rates file has ARM-source, ARM-muon, ARM-muon-other, ARM-adamw)",
                  f.path.c_str(), e.line, e.key.c_str());
        }
        auto& fields = arms[e.key.substr(0, e.key.size() - field.size() - 1)];
        if (!fields.emplace(field, &e).second) { fatal("%s line %d: %s is set twice in the file", f.path.c_str(), e.line, e.key.c_str()); }
    }
    for (const auto& [name, fields] : arms) {
        if (!fields.count("source") || !fields.count("adamw")) {
            fatal("%s: the arm %s needs %s-source and %s-adamw", f.path.c_str(), name.c_str(), name.c_str(), name.c_str());
        }
        if (fields.count("muon") != fields.count("muon-other")) {
            fatal("%s: the arm %s has one of %s-muon, %s-muon-other without the other", f.path.c_str(), name.c_str(),
                  name.c_str(), name.c_str());
        }
    }
    auto it = arms.find(arm);
    if (it == arms.end()) { fatal("%s has no rates for the arm %s", f.path.c_str(), arm.c_str()); }
    const auto& fields = it->second;
    DefaultRates r;
    r.source = fields.at("source")->value;
    r.adamw = f.real(*fields.at("adamw"));
    if (fields.count("muon")) {
        r.muon = f.real(*fields.at("muon"));
        r.muon_other = f.real(*fields.at("muon-other"));
    }
    return r;
}
