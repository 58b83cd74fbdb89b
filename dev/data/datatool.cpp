/*
Inspects data files with the C++ readers (llmc/data/dataloader.h, llmc/data/tokenizer.h,
llmc/data/evalset.h); the Python tests use it to check that both sides agree.
  make build/host-bf16/datatool
  datatool decode TOKENIZER.bin SHARD.bin     decoded text of the whole shard (control tokens hidden)
  datatool regions SHARD.bin                   "tokens N" and the count of each region label
  datatool exercises SHARD.bin                 "tokens N" and "NAME COUNT" per exercise of the shard's table
  datatool eval EVAL.bin                       kind, items, and per item: gold, n_ctx, choice lengths
  datatool batch PATTERN B T [BOS [whole]]     first batch of a DataLoader: one line per row,
                                               "tokens | targets | regions | exercise names | doc ids";
                                               "whole": whole-document rows (padding token 0)
*/
#include <cstdio>
#include <cstdlib>

#include "llmc/data/dataloader.h"
#include "llmc/data/evalset.h"
#include "llmc/data/tokenizer.h"

int main(int argc, char** argv) {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "decode" && argc == 4) {
        Tokenizer tok(argv[2]);
        std::vector<int32_t> ids = read_token_shard(argv[3]);
        std::string text = tok.decode(ids.data(), ids.size());
        fwrite(text.data(), 1, text.size(), stdout);
    } else if (cmd == "regions" && argc == 3) {
        ShardInfo s = inspect_shard(argv[2]);
        long counts[4] = {0, 0, 0, 0};
        if (!s.regions_path.empty()) {
            CheckedFile f(s.regions_path, "rb");
            f.seek(DATA_HEADER_BYTES);
            std::vector<uint8_t> r;
            f.read_vector(r, s.ntok, "region labels");
            for (uint8_t v : r) {
                if (v > 3) { fatal("'%s': bad label %d", s.regions_path.c_str(), v); }
                counts[v]++;
            }
        }
        printf("tokens %lld\nother %ld\nquery %ld\ntrace %ld\nanswer %ld\n", (long long)s.ntok, counts[0], counts[1],
               counts[2], counts[3]);
    } else if (cmd == "exercises" && argc == 3) {
        ShardInfo s = inspect_shard(argv[2]);
        printf("tokens %lld\n", (long long)s.ntok);
        if (!s.exercises_path.empty()) {
            CheckedFile f(s.exercises_path, "rb");
            f.seek(s.exercise_ids_offset);
            std::vector<uint8_t> ids;
            f.read_vector(ids, s.ntok, "exercise ids");
            std::vector<long> counts(s.exercise_names.size(), 0);
            for (uint8_t v : ids) {
                if (v >= counts.size()) { fatal("'%s': bad exercise id %d", s.exercises_path.c_str(), v); }
                counts[v]++;
            }
            for (size_t k = 0; k < counts.size(); k++) { printf("%s %ld\n", s.exercise_names[k].c_str(), counts[k]); }
        }
    } else if (cmd == "eval" && argc == 3) {
        EvalSet es = load_evalset(argv[2]);
        printf("kind %d items %zu vocab %d\n", es.kind, es.items.size(), es.vocab_size);
        for (const EvalItem& it : es.items) {
            printf("%d %zu", it.gold, it.context.size());
            for (size_t c = 0; c < it.choices.size(); c++) { printf(" %zu:%d", it.choices[c].size(), it.choice_chars[c]); }
            printf("\n");
        }
    } else if (cmd == "batch" && (argc == 5 || argc == 6 || (argc == 7 && std::string(argv[6]) == "whole"))) {
        DataLoaderConfig c;
        c.pattern = argv[2];
        c.B = atoi(argv[3]);
        c.T = atoi(argv[4]);
        c.doc_start_token = argc >= 6 ? atoi(argv[5]) : -1;
        c.whole_documents = argc == 7;
        DataLoader dl(c);
        dl.next_batch();
        for (int b = 0; b < dl.B; b++) {
            size_t o = (size_t)b * (dl.T + 1);
            for (int t = 0; t <= dl.T; t++) { printf("%d ", dl.tokens[o + t]); }
            printf("|");
            for (int t = 0; t < dl.T; t++) { printf(" %d", dl.targets[(size_t)b * dl.T + t]); }
            printf(" |");
            for (int t = 0; t <= dl.T; t++) { printf(" %d", dl.regions[o + t]); }
            printf(" |");
            for (int t = 0; t <= dl.T; t++) { printf(" %s", dl.exercise_names[dl.exercises[o + t]].c_str()); }
            printf(" |");
            for (int t = 0; t <= dl.T; t++) { printf(" %d", dl.doc_ids[o + t]); }
            printf("\n");
        }
    } else {
        fprintf(stderr, "usage: datatool decode TOKENIZER SHARD | regions SHARD | exercises SHARD | eval EVAL | "
                        "batch PATTERN B T [BOS [whole]]\n");
        return 2;
    }
    return 0;
}
