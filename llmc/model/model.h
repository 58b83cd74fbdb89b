/*
What every trainer's model has and does alike, so that the trainers' models hold only what
differs: ModelDims (the sizes every config has, their checkpoint keys and flags), LanguageModel
<Config> (the base of a model: parameters, config, residual stream, logits and loss, sampling
cache), and what is computed from them: parameter counts, FLOPs per token, loss targets, samples,
checkpoints. A config derives from ModelDims and adds embedding_numel() and kv_width(); the
trainer file defines parameter_spec(cfg) and write_config(writer, cfg), found here by
argument-dependent lookup. The SAN model itself: doc/san-model.md; the checkpoint: doc/formats.md.
*/
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "llmc/cli.h"
#include "llmc/cuda_common.h"
#include "llmc/kernels/classifier.cuh"  // defines: LossStats, classifier_loss_sums
#include "llmc/kernels/embedding.cuh"
#include "llmc/kernels/kv_cache.cuh"
#include "llmc/model/sampling.h"  // defines: sample_tokens
#include "llmc/optim/param_spec.h"
#include "llmc/model/parameters.h"
#include "llmc/data/tensor_file.h"

// The sizes both model families have; the defaults are the references' "tiny" preset.
struct ModelDims {
    int vocab_size = 250;  // real vocabulary V (the embedding is padded to a multiple of 128)
    int seq_len = 64;      // the model's context T (--max-seq-len)
    int n_layer = 2;
    int n_embd = 64;
    int n_head = 4;        // (query) heads
    int bos_id = 2;        // the token that starts a document and a sample

    int padded_vocab() const { return CEIL_DIV(vocab_size, 128) * 128; }
    int head_dim() const { return n_embd / n_head; }
    // the preset's sizes in one call (vocabulary, context, layers, width, heads)
    void set_sizes(int vocab, int context, int layers, int width, int heads) {
        vocab_size = vocab, seq_len = context, n_layer = layers, n_embd = width, n_head = heads;
    }
    void check_dims() const {
        auto require = [](bool ok, const char* what) {
            if (!ok) { fatal("bad model config: %s", what); }
        };
        require(vocab_size > 0 && seq_len > 0 && n_layer > 0 && n_embd > 0, "vocab, seq_len, layers and width must be positive");
        require(n_head > 0 && n_embd % n_head == 0, "--n-embd must be a multiple of --n-head");
        require(bos_id >= 0 && bos_id < vocab_size, "--bos-id must be a token id below the vocabulary size");
    }
    void write_dims(TensorFileWriter& w) const {
        w.set("vocab_size", vocab_size);
        w.set("seq_len", seq_len);
        w.set("n_layer", n_layer);
        w.set("n_embd", n_embd);
        w.set("n_head", n_head);
        w.set("bos_id", bos_id);
        w.set("padded_vocab_size", padded_vocab());
        w.set("head_dim", head_dim());
    }
    void read_dims(const TensorFileReader& r) {
        vocab_size = r.int32("vocab_size");
        seq_len = r.int32("seq_len");
        n_layer = r.int32("n_layer");
        n_embd = r.int32("n_embd");
        n_head = r.int32("n_head");
        bos_id = r.int32("bos_id");
    }
    // after read_dims and the config check: the derived keys must follow from the config
    void check_derived(const TensorFileReader& r) const {
        if (r.integer("padded_vocab_size") != padded_vocab() || r.integer("head_dim") != head_dim()) {
            r.fail("padded_vocab_size/head_dim do not follow from the config");
        }
    }
    // --preset, then the sizes' flags (`context_help`: what the context sets; `heads_help`)
    static std::vector<Flag> flags(std::string* preset, ModelDims& m, const std::string& preset_help,
                                   const char* context_help, const char* heads_help, const char* bos_help) {
        return {make_flag("--preset", preset, preset_help),
                make_flag("--vocab-size", &m.vocab_size, "real vocabulary size V (embedding padded to a multiple of 128)"),
                make_flag("--max-seq-len", &m.seq_len, context_help),
                make_flag("--n-layer", &m.n_layer, "layers L"),
                make_flag("--n-embd", &m.n_embd, "width d"),
                make_flag("--n-head", &m.n_head, heads_help),
                make_flag("--bos-id", &m.bos_id, bos_help)};
    }
};

struct ParameterCounts {
    int64_t total = 0, non_embedding = 0;
};

// {total, non-embedding}; total includes the padded vocabulary rows.
template <typename Config>
ParameterCounts count_parameters(const Config& c) {
    int64_t total = (int64_t)total_numel(parameter_spec(c));
    return {total, total - c.embedding_numel()};
}

// 6 * (non-embedding parameters + the LM head V * d) + 12 * L * T * d for the attention
// scores and values (PaLM's convention; train_san.py and train_gpt2.py count the same).
template <typename Config>
double flops_per_token(const Config& c) {
    double nonemb = (double)count_parameters(c).non_embedding;
    return 6.0 * (nonemb + (double)c.vocab_size * c.n_embd) + 12.0 * c.n_layer * (double)c.seq_len * c.n_embd;
}

// The targets that enter the loss (model.counts_in_loss).
template <typename Model>
int64_t count_loss_targets(const Model& model, const int* targets, int n) {
    int64_t count = 0;
    for (int i = 0; i < n; i++) { count += model.counts_in_loss(targets[i]); }
    return count;
}

// Continues `tokens` by n tokens, sampling from softmax(logits / temperature) over the real
// vocabulary (temperature 0: greedy); the context is the model's last T tokens. With
// use_cache, one cached forward step per position while the sequence fits in T, else the
// window is recomputed for each token (llmc/kernels/kv_cache.cuh).
template <typename Model>
std::vector<int> sample(Model& model, std::vector<int> tokens, int n, float temperature, std::mt19937_64& rng,
                        bool use_cache = true) {
    return sample_tokens(model, std::move(tokens), n, temperature, rng, use_cache);
}

// The container of doc/formats.md (readable by the trainer's PyTorch reference): the config
// (write_config), the optimizer and the parameters; `extra` adds keys such as the resume position.
template <typename Model>
void save_checkpoint(const Model& model, const std::string& path,
                     const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    model.write_checkpoint(path, extra, [&](TensorFileWriter& w) { write_config(w, model.cfg); });
}

// Pinned host memory (cudaMallocHost): a copy from or into it is one DMA that the host can queue
// on a stream (cudaMemcpyAsync) without waiting; freed with its owner.
template <typename T>
struct PinnedBuffer {
    T* data = nullptr;
    explicit PinnedBuffer(size_t count) { cudaCheck(cudaMallocHost(&data, std::max<size_t>(count, 1) * sizeof(T))); }
    ~PinnedBuffer() { cudaFreeHost(data); }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

// A CUDA event (cudaEventDisableTiming), created and destroyed with its owner: record() marks
// the stream's position, wait() waits for the stream to pass it (not for the whole stream).
struct StreamEvent {
    cudaEvent_t event = nullptr;
    StreamEvent() { cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
    ~StreamEvent() { cudaEventDestroy(event); }
    StreamEvent(const StreamEvent&) = delete;
    StreamEvent& operator=(const StreamEvent&) = delete;
    void record(cudaStream_t stream) { cudaCheck(cudaEventRecord(event, stream)); }
    void wait() const { cudaCheck(cudaEventSynchronize(event)); }
};

// The base of a trainer's model (SAN, GPT2): ModelParameters, and for B rows of T positions
// the buffers every model has (the residual stream, logits and loss buffers, the backward's
// stream gradient, the sampling cache); the model adds its tensors' pointers and activations.
template <typename Config>
struct LanguageModel : ModelParameters {
    Config cfg;
    int B, T;  // capacity of the activations: B rows of T positions
    DeviceArena arena;
    std::vector<floatX*> residual;  // L + 1 residual-stream states (N, d)
    float* logits = nullptr;        // (N, Vp) fp32
    floatX* dlogits = nullptr;      // (N, Vp): d(loss * dloss_scale)/d logits
    float *row_loss = nullptr, *row_lse_sq = nullptr;  // per position: cross-entropy, lse^2
    int *d_inputs = nullptr, *d_targets = nullptr;
    floatX *dx = nullptr, *dxf = nullptr;  // backward: dL/d(residual stream), dL/d(final norm output)
    EmbeddingBuckets buckets;             // the embedding backward's positions per token
    // A micro-batch's ids on their way up, 3 N ints (inputs | targets | document ids): the trainer
    // fills them after begin_staging(), which waits for the copies the last forward queued from
    // them (the event upload_ids records after each), and queues their copies (upload_ids).
    PinnedBuffer<int> staged_ids;
    StreamEvent staged_ids_read;
    // The loss sums back from the device (loss_sums): 2 doubles a forward, in slot 0, or with the
    // loss queue open (begin_loss_queue) in the forward's own slot of the step
    std::unique_ptr<PinnedBuffer<double>> loss_host;
    double* d_loss_sums = nullptr;
    int loss_slots = 0;         // slots of loss_host and d_loss_sums
    int queued_losses = -1;     // forwards whose sums are queued since begin_loss_queue (-1: closed)
    StreamEvent losses_copied;  // recorded after the last queued copy of sums
    int last_B = 0, last_T = 0;           // the last forward's batch (what backward() differentiates)
    KVCache kv;                           // sampling's keys and values (sample() below)

    LanguageModel(const Config& config, int batch, int seq)
        : ModelParameters(parameter_spec(config)), cfg(config), B(batch), T(seq),
          staged_ids(3 * (size_t)batch * seq) {
        if (T > cfg.seq_len) { fatal("sequence length %d exceeds the model's seq_len %d", T, cfg.seq_len); }
        const size_t N = (size_t)B * T, d = cfg.n_embd, Vp = cfg.padded_vocab();
        for (int l = 0; l <= cfg.n_layer; l++) { residual.push_back(arena.alloc<floatX>(N * d)); }
        logits = arena.alloc<float>(N * Vp);
        dlogits = arena.alloc<floatX>(N * Vp);
        row_loss = arena.alloc<float>(N);
        row_lse_sq = arena.alloc<float>(N);
        d_inputs = arena.alloc<int>(N);
        d_targets = arena.alloc<int>(N);
        dx = arena.alloc<floatX>(N * d);
        dxf = arena.alloc<floatX>(N * d);
        reserve_loss_slots(1);
    }
    ~LanguageModel() { cudaFree(d_loss_sums); }

    int* staged_inputs() { return staged_ids.data; }
    int* staged_targets() { return staged_ids.data + (size_t)B * T; }
    int* staged_doc_ids() { return staged_ids.data + 2 * (size_t)B * T; }
    // Before the staging is written: the copies queued from it have read it
    void begin_staging() { staged_ids_read.wait(); }
    // `count` staged ids to the device, queued on the stream
    void upload_ids(int* device, const int* staged, int count) {
        cudaCheck(cudaMemcpyAsync(device, staged, (size_t)count * sizeof(int), cudaMemcpyHostToDevice, stream));
        staged_ids_read.record(stream);
    }

    // The classifier's per-row outputs of the first N rows summed on the device (lse^2 too when
    // asked). Waits for the stream, unless the loss queue is open: then the sums and their copy
    // are queued in this forward's slot, and the sums returned are NaN until read_loss_queue().
    LossStats loss_sums(int N, bool with_lse_sq) {
        const float* lse_sq = with_lse_sq ? row_lse_sq : nullptr;
        if (queued_losses < 0) { return classifier_loss_sums(row_loss, lse_sq, N, d_loss_sums, loss_host->data, stream); }
        if (queued_losses == loss_slots) { fatal("loss_sums: more forwards than the %d of begin_loss_queue", loss_slots); }
        const size_t slot = 2 * (size_t)queued_losses++;
        classifier_loss_sums_queue(row_loss, lse_sq, N, d_loss_sums + slot, loss_host->data + slot, stream);
        losses_copied.record(stream);
        LossStats pending;
        pending.ce_sum = pending.lse_sq_sum = std::nan("");
        return pending;
    }
    // The training loop's micro-batches (llmc/train/training.h): the next `forwards` forwards do
    // not wait for their loss sums; read_loss_queue() waits once, after their backward passes are
    // queued, for the last copy (not for the stream), and returns the sums in the forwards' order.
    void begin_loss_queue(int forwards) {
        reserve_loss_slots(forwards);
        queued_losses = 0;
    }
    std::vector<LossStats> read_loss_queue() {
        losses_copied.wait();
        std::vector<LossStats> sums(std::max(queued_losses, 0));
        for (size_t i = 0; i < sums.size(); i++) {
            sums[i].ce_sum = loss_host->data[2 * i];
            sums[i].lse_sq_sum = loss_host->data[2 * i + 1];
        }
        queued_losses = -1;
        return sums;
    }
    // (no copy into the buffers is queued when they grow: begin_loss_queue follows a read)
    void reserve_loss_slots(int slots) {
        if (slots <= loss_slots) { return; }
        cudaFree(d_loss_sums);
        d_loss_sums = cudaMallocElements(double, 2 * (size_t)slots);
        loss_host = std::make_unique<PinnedBuffer<double>>(2 * (size_t)slots);
        loss_slots = slots;
    }

    // A forward's batch: within the activations, or (sampling with `cache`) one position
    // within the cache; recorded for backward().
    void begin_forward(int Bn, int Tn, float dloss_scale, const KVCache* cache) {
        if (cache != nullptr && (Bn != 1 || Tn != 1 || cache->pos >= cache->capacity || dloss_scale != 0.0f)) {
            fatal("forward: a cached step is one position within the cache's %d rows", cache->capacity);
        }
        if (Bn > B || Tn > T || (size_t)Bn * Tn > (size_t)B * T) {
            fatal("forward: batch %d x %d exceeds the allocated %d x %d", Bn, Tn, B, T);
        }
        last_B = Bn;
        last_T = Tn;
    }
};
