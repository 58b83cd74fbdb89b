/*
The files a run reads, checked before it prints its model (llmc/train/trainer.h), so that a
wrong path fails at once, naming the flag that gave it ("--tokenizer: no such file 'x'",
"--train-data: no file matches 'x_*.bin'"), and not after the start-of-run summary:
  - check_start_files: --tokenizer, --resume, --init-from, before any of them is read;
  - check_run_files: once the options are resolved (a resume takes its data from the
    checkpoint), the shards of --train-data and --val-data (each header: llmc/data/dataloader.h
    inspect_shard), the --eval-sets files, the directory of --log, and --prompt's tokenizer;
  - check_data_tokenizers: the tokenizer each data file records, against --tokenizer, the
    checkpoint the run starts from and the other files.
The readers check the contents again as they read (their errors name the file). Host-only C++17.
*/
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "llmc/data/dataloader.h"  // defines: glob_shards, inspect_shard
#include "llmc/data/evalset.h"     // defines: evalset_tokenizer
#include "llmc/data/tensor_file.h"  // defines: TensorFileReader
#include "llmc/data/tokenizer.h"
#include "llmc/train/run_record.h"  // defines: newest_checkpoint
#include "llmc/train/train_options.h"
#include "llmc/utils.h"

// `path`, given with `flag`, is a file this process can read.
inline void check_input_file(const std::string& flag, const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) { fatal("%s: no such file '%s'", flag.c_str(), path.c_str()); }
        fatal("%s: cannot read '%s': %s", flag.c_str(), path.c_str(), strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) { fatal("%s: '%s' is a directory, not a file", flag.c_str(), path.c_str()); }
    if (access(path.c_str(), R_OK) != 0) { fatal("%s: cannot read '%s': %s", flag.c_str(), path.c_str(), strerror(errno)); }
}

// The token shards of comma-separated glob `patterns` given with `flag`: each matches, can be
// read and has a valid header (and sidecars); an error in a file names the flag at its end.
inline void check_data_files(const std::string& flag, const std::string& patterns) {
    for (const std::string& f : glob_shards(patterns, flag)) {
        struct stat st;
        if (stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            // the pattern of this flag's shards: a train/val split by name (doc/formats.md) keeps them apart
            const bool val = flag.rfind("--val-data", 0) == 0, train = flag.rfind("--train-data", 0) == 0;
            const std::string split = val ? "/*_val_*.bin" : "/*_train_*.bin";
            glob_t g;
            const bool split_names = (train || val) && glob((f + split).c_str(), 0, nullptr, &g) == 0;
            if (split_names) { globfree(&g); }
            const std::string pattern = f + (split_names ? split : "/*.bin");
            fatal("%s: '%s' is a directory, not a token shard (a pattern of its shards, quoted: '%s'?)",
                  flag.c_str(), f.c_str(), pattern.c_str());
        }
        check_input_file(flag, f);
        FatalContext reading(flag, flag);
        inspect_shard(f);
    }
}

// --init-from DIR: what the directory is (a run directory, a Hugging Face export) and what to pass.
inline void check_init_from(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        const std::string newest = newest_checkpoint(path);
        if (!newest.empty()) {
            fatal("--init-from: '%s' is a run directory: pass one of its checkpoints, e.g. its newest, --init-from %s "
                  "(--resume %s continues the run instead)", path.c_str(), newest.c_str(), path.c_str());
        }
        if (access((path + "/config.json").c_str(), F_OK) == 0) {
            fatal("--init-from: '%s' is a Hugging Face model directory: turn it into a checkpoint with `.venv/bin/python "
                  "-m attnref.import_hf %s CKPT` (doc/export.md), then pass --init-from CKPT", path.c_str(), path.c_str());
        }
    }
    check_input_file("--init-from", path);
}

// --tokenizer takes the tokenizer .bin: a SentencePiece .model (or any other file) is named
// with the .bin of the same name beside it, which the tokenizer scripts write from it.
inline void check_tokenizer_file(const std::string& path) {
    check_input_file("--tokenizer", path);
    int32_t magic = 0;
    FILE* f = fopen(path.c_str(), "rb");
    const bool read = f != nullptr && fread(&magic, sizeof(magic), 1, f) == 1;
    if (f != nullptr) { fclose(f); }
    if (read && magic == TOKENIZER_MAGIC) { return; }
    const size_t dot = path.find_last_of('.'), slash = path.find_last_of('/');
    const std::string bin = (dot != std::string::npos && (slash == std::string::npos || dot > slash) ? path.substr(0, dot) : path) + ".bin";
    if (bin != path && access(bin.c_str(), R_OK) == 0) {
        fatal("--tokenizer %s is not a tokenizer .bin (a SentencePiece .model?): the trainers read the .bin written "
              "beside it: use --tokenizer %s", path.c_str(), bin.c_str());
    }
}

// Before the trainer reads a file: the ones it reads first.
inline void check_start_files(const TrainOptions& o) {
    if (!o.tokenizer_path.empty()) { check_tokenizer_file(o.tokenizer_path); }
    if (!o.resume_path.empty()) { check_input_file("--resume", o.resume_path); }
    if (!o.init_from.empty()) { check_init_from(o.init_from); }
}

// Once the options are resolved (check_training_options): the files the training run
// reads, and where its log goes. On a resume the data patterns are the saved run's: their
// errors say so.
inline void check_run_files(const TrainOptions& o) {
    auto data_flag = [&](const char* flag) {
        return !o.resume_path.empty() && !o.given.count(flag) ? std::string(flag) + " (saved in " + o.resume_path + ")"
                                                              : std::string(flag);
    };
    if (o.steps > 0) { check_data_files(data_flag("--train-data"), o.train_data); }
    if (!o.val_data.empty()) { check_data_files(data_flag("--val-data"), o.val_data); }
    for (size_t pos = 0; pos <= o.eval_sets.size() && !o.eval_sets.empty();) {
        size_t comma = std::min(o.eval_sets.find(',', pos), o.eval_sets.size());
        std::string path = o.eval_sets.substr(pos, comma - pos);
        pos = comma + 1;
        if (path.empty()) { fatal("--eval-sets '%s': an empty file name in the list", o.eval_sets.c_str()); }
        check_input_file("--eval-sets", path);
    }
    if (!o.log_path.empty()) {
        size_t slash = o.log_path.find_last_of('/');
        std::string dir = slash == std::string::npos ? "." : o.log_path.substr(0, std::max<size_t>(slash, 1));
        struct stat st;
        // (the --checkpoint-dir and the --run-dir are made by the run itself, so a log inside either is fine)
        const bool made_by_run = (!o.checkpoint_dir.empty() && dir == o.checkpoint_dir) || (!o.run_dir.empty() && dir == o.run_dir);
        if (!made_by_run && (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
            fatal("--log: no such directory '%s' (for the log '%s')", dir.c_str(), o.log_path.c_str());
        }
        if (stat(o.log_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            fatal("--log: '%s' is a directory, not a file", o.log_path.c_str());
        }
    }
    if (!o.prompt.empty() && o.tokenizer_path.empty()) { fatal("--prompt needs --tokenizer (the file that encodes it)"); }
}

// The tokenizer a checkpoint's model was trained with (run.tokenizer_fingerprint: its training
// data's, or its --tokenizer's; absent in files from before 2026-12-07 and from runs on data
// that records none).
inline TokenizerRecord checkpoint_tokenizer(const TensorFileReader& checkpoint) {
    TokenizerRecord r;
    if (!checkpoint.has_key("run.tokenizer_fingerprint")) { return r; }
    const std::string text = checkpoint.str("run.tokenizer_fingerprint");
    char* end = nullptr;
    const unsigned long value = strtoul(text.c_str(), &end, 16);
    if (text.empty() || *end != '\0' || value > UINT32_MAX) {
        fatal("file '%s': key run.tokenizer_fingerprint is '%s', not 8 hex digits (corrupt file)", checkpoint.path().c_str(),
              text.c_str());
    }
    r.fingerprint = (uint32_t)value;
    r.present = true;
    return r;
}

// Every data file (shards, eval sets) that records its tokenizer (llmc/data/tokenizer_record.h),
// and the checkpoint the run starts from (`start`, with its flag: --init-from or --resume; null
// for none), records --tokenizer's, or without one, the checkpoint's, or the first data file's:
// token ids of another tokenizer mean other pieces, and would train and score without a
// complaint (a model scored on another tokenizer's shards gives a loss that means nothing). A
// mismatch names both files; files from before the field are said in one note per flag.
// --check-tokenizer 0 skips the comparison. Returns the fingerprint they share (what the run's
// checkpoints record), absent when none records one.
inline TokenizerRecord check_data_tokenizers(const TrainOptions& o, const Tokenizer& tokenizer, const TensorFileReader* start,
                                             const char* start_flag) {
    std::string reference;  // what the others are compared with: "--tokenizer FILE" or "FLAG FILE"
    TokenizerRecord shared;
    if (tokenizer.loaded()) {
        reference = "--tokenizer " + tokenizer.path();
        shared = {tokenizer.fingerprint(), true};
    }
    auto compare = [&](const std::string& flag, const std::string& file, TokenizerRecord r) {
        if (!r.present) { return false; }
        if (reference.empty()) {
            reference = flag + " " + file;
            shared = r;
        } else if (r.fingerprint != shared.fingerprint && o.check_tokenizer != 0) {
            fatal("%s %s was made with another tokenizer (fingerprint %08x) than %s (%08x): its token ids stand for "
                  "other pieces. Give data and a tokenizer of one build, or --check-tokenizer 0 if the pieces are the "
                  "same", flag.c_str(), file.c_str(), r.fingerprint, reference.c_str(), shared.fingerprint);
        }
        return true;
    };
    if (start != nullptr) { compare(start_flag, start->path(), checkpoint_tokenizer(*start)); }
    if (o.check_tokenizer == 0) { return shared; }
    auto note_unrecorded = [&](const std::string& flag, int unrecorded, int total) {
        if (unrecorded == 0 || reference.empty()) { return; }
        fprintf(stderr, "note: %d of %d files of %s record no tokenizer (written before the field, 2026-12-05): not "
                "compared with %s\n", unrecorded, total, flag.c_str(), reference.c_str());
    };
    for (const auto& [flag, patterns] : {std::make_pair(std::string("--train-data"), o.steps > 0 ? o.train_data : ""),
                                         std::make_pair(std::string("--val-data"), o.val_data)}) {
        if (patterns.empty()) { continue; }
        const std::vector<std::string> files = glob_shards(patterns, flag);
        int unrecorded = 0;
        for (const std::string& f : files) { unrecorded += !compare(flag, f, inspect_shard(f).tokenizer); }
        note_unrecorded(flag, unrecorded, (int)files.size());
    }
    int unrecorded = 0, total = 0;
    for (size_t pos = 0; pos < o.eval_sets.size();) {
        size_t comma = std::min(o.eval_sets.find(',', pos), o.eval_sets.size());
        const std::string path = o.eval_sets.substr(pos, comma - pos);
        pos = comma + 1;
        total++;
        unrecorded += !compare("--eval-sets", path, evalset_tokenizer(path));
    }
    note_unrecorded("--eval-sets", unrecorded, total);
    return shared;
}
