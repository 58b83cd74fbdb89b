/*
Config files for the trainers (--config FILE): flat `key = value` lines, the keys the flag names
without `--`. with_config_file puts the file's settings before the command line's flags (so a
flag given there wins); check_config_keys refuses an unknown key, naming the file and the line.
A run directory's `config` is this format with every flag's resolved value (config_text), so
`--config RUN` repeats the run; the presets and recipes (presets/NAME.conf, presets/recipes/) are
written in it too and compiled in (llmc/train/preset_files.h). Host-only C++17. The syntax
(comments, quoting) and the errors: doc/formats.md "Config files".
*/
#pragma once

#include <sys/stat.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cli.h"
#include "llmc/utils.h"

// One `key = value` line of a config file.
struct ConfigEntry {
    std::string key, value;
    int line = 0;
};

// A value as the config file writes it: quoted where a plain value would not read back.
inline std::string config_value_text(const std::string& v) {
    bool plain = v.empty() ? false : !isspace((unsigned char)v.front()) && !isspace((unsigned char)v.back()) && v[0] != '"';
    for (char c : v) { plain = plain && c != '\n' && c != '\r'; }
    if (plain) { return v; }
    std::string out = "\"";
    for (char c : v) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out + "\"";
}

inline std::string trim_spaces(const std::string& s) {
    size_t a = 0, b = s.size();
    while (a < b && isspace((unsigned char)s[a])) { a++; }
    while (b > a && isspace((unsigned char)s[b - 1])) { b--; }
    return s.substr(a, b - a);
}

// The settings of config text, in order; a line that is not `key = value` (or a value with an
// unclosed quote) fails, naming `where` (e.g. "--config FILE") and the line.
inline std::vector<ConfigEntry> parse_config_text(const std::string& all, const std::string& where) {
    std::istringstream in(all);
    std::vector<ConfigEntry> out;
    std::string text;
    for (int line = 1; std::getline(in, text); line++) {
        std::string s = trim_spaces(text);
        if (s.empty() || s[0] == '#') { continue; }
        size_t eq = s.find('=');
        if (eq == std::string::npos || trim_spaces(s.substr(0, eq)).empty()) {
            fatal("%s line %d: expected `key = value` (a flag's name without --), got '%s'", where.c_str(), line,
                  s.c_str());
        }
        ConfigEntry e;
        e.key = trim_spaces(s.substr(0, eq));
        e.value = trim_spaces(s.substr(eq + 1));
        e.line = line;
        if (e.key.rfind("--", 0) == 0) { e.key = e.key.substr(2); }
        if (!e.value.empty() && e.value[0] == '"') {
            std::string v;
            size_t i = 1;
            for (; i < e.value.size() && e.value[i] != '"'; i++) {
                if (e.value[i] == '\\' && i + 1 < e.value.size()) {
                    i++;
                    v += e.value[i] == 'n' ? '\n' : e.value[i];
                } else {
                    v += e.value[i];
                }
            }
            if (i != e.value.size() - 1) {
                fatal("%s line %d: the quoted value of %s %s", where.c_str(), line, e.key.c_str(),
                      i >= e.value.size() ? "has no closing quote" : "has text after its closing quote");
            }
            e.value = v;
        }
        out.push_back(e);
    }
    return out;
}

inline std::vector<ConfigEntry> read_config_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) { fatal("--config %s: cannot read it: %s", path.c_str(), strerror(errno)); }
    std::ostringstream text;
    text << in.rdbuf();
    return parse_config_text(text.str(), "--config " + path);
}

// --config's file: PATH, or PATH/config where PATH is a directory (a run directory keeps the
// run's settings there); a directory without one is refused, not read as an empty file.
inline std::string config_file_in(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) { return path; }
    const std::string inside = path + (path.back() == '/' ? "" : "/") + "config";
    if (stat(inside.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        fatal("--config %s is a directory with no file `config` in it: give a config file (a run directory's "
              "`config`, or one of `key = value` lines)", path.c_str());
    }
    return inside;
}

// The command line with --config FILE replaced by the file's settings, placed before the other
// flags (so that those win). `words` starts with the program name.
struct CommandLine {
    std::vector<std::string> words;
    std::string config_path;           // "" without --config
    std::vector<ConfigEntry> entries;  // the file's settings
    std::vector<char*> pointers;

    int argc() const { return (int)words.size(); }
    char** argv() {
        pointers.clear();
        for (std::string& w : words) { pointers.push_back(&w[0]); }
        pointers.push_back(nullptr);
        return pointers.data();
    }
};

inline CommandLine with_config_file(int argc, char** argv) {
    CommandLine c;
    std::vector<std::string> rest;
    for (int i = 1; i < argc; i++) {
        FlagWord w = split_flag_word(argv[i]);
        if (w.name != "--config") {
            rest.push_back(argv[i]);
            continue;
        }
        if (!c.config_path.empty()) { fatal("--config is given twice (%s and another): give one file", c.config_path.c_str()); }
        if (!w.has_value) {
            if (i + 1 >= argc) { fatal("option --config needs a value (a file of `key = value` lines)"); }
            w.value = argv[++i];
        }
        if (w.value.empty()) { fatal("option --config: empty file name"); }
        c.config_path = config_file_in(w.value);
    }
    c.words.push_back(argv[0]);
    if (!c.config_path.empty()) {
        c.entries = read_config_file(c.config_path);
        for (const ConfigEntry& e : c.entries) { c.words.push_back("--" + e.key + "=" + e.value); }
    }
    c.words.insert(c.words.end(), rest.begin(), rest.end());
    return c;
}

// Every key of the config file is a flag (not --config itself, nor one twice) and its value one
// the flag takes: else an error naming the file, the line (and the nearest flag).
inline void check_config_keys(const CommandLine& c, const std::vector<Flag>& flags) {
    std::set<std::string> seen;
    for (const ConfigEntry& e : c.entries) {
        const std::string name = "--" + e.key;
        if (name == "--config") { fatal("--config %s line %d: a config file cannot name another", c.config_path.c_str(), e.line); }
        const Flag* flag = nullptr;
        for (const Flag& f : flags) { flag = f.name == name ? &f : flag; }
        if (flag == nullptr) {
            fatal("--config %s line %d: unknown setting '%s'%s", c.config_path.c_str(), e.line, e.key.c_str(),
                  nearest_flag_hint(name, flags).c_str());
        }
        if (!seen.insert(e.key).second) {
            fatal("--config %s line %d: %s is set twice in the file", c.config_path.c_str(), e.line, e.key.c_str());
        }
        // the value, read as the flag reads it (into the caller's probe options): an error names the line
        const FatalContext where("--config " + c.config_path + " line " + std::to_string(e.line), c.config_path);
        flag->parse(e.value.c_str());
    }
}

// The (key, value) settings of `flags` (keys without --), leaving out the names in `skip`.
inline std::vector<std::pair<std::string, std::string>> flag_settings(const std::vector<Flag>& flags,
                                                                      const std::set<std::string>& skip) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Flag& f : flags) {
        if (!skip.count(f.name)) { out.push_back({f.name.substr(2), f.text()}); }
    }
    return out;
}

// The settings as a config file: `header` lines (each written as a comment), then key = value.
inline std::string config_text(const std::vector<std::pair<std::string, std::string>>& settings,
                               const std::vector<std::string>& header) {
    std::string out;
    for (const std::string& h : header) { out += "# " + h + "\n"; }
    size_t width = 0;
    for (const auto& kv : settings) { width = std::max(width, kv.first.size()); }
    for (const auto& [key, value] : settings) {
        out += key + std::string(width - key.size(), ' ') + " = " + config_value_text(value) + "\n";
    }
    return out;
}
