/*
test_data_parallel: the optimizer step over N ranks (llmc/parallel/data_parallel.h through
ParamOptimizer) against one rank given the sum of the ranks' gradients. Run as N ranks
(`scripts/mpirun.sh -np 2 build/host-fp32/test_data_parallel`, as `make test` does).

Every rank regenerates every rank's gradients, so it can run the reference itself: a
ModelParameters that is not distributed, fed with the sum computed here as the host
stand-in defines it (pairwise by rank, every sum rounded into the gradient type). The layout mixes matrices of several shapes with vectors and scalars, so ZeRO-1
chunks cut tensors mid-way and the Muon owners differ.

  adamw_zero0, adamw_zero1, muon_zero0, muon_zero1   5 steps, no clipping: the parameters
      (floatX, every rank) equal the reference's bit for bit, and so do the gradient norms,
      ZeRO-1 included (each rank squares what it holds, per 64-element unit; the units are
      added in one order: before, ZeRO-1's per-rank sums differed by up to 2.3e-7); then
      every rank's own state (AdamW m and v, Muon momentum, bf16 master weights), kept
      compact under ZeRO-1, equals the reference's full state on the pieces it owns, bit
      for bit, and under ZeRO-1 with Muon no rank holds the full master weights;
  overlap_*       the same with two buckets of whole tensors reduced early (reduce_early, as
      backward() hands over finished layers) and the rest in update(): the same bits;
  state_bytes_*   the optimizer state a rank holds under ZeRO-1 is at most the 1-rank state
      / N plus one matrix and the 64-element rounding of each tensor (printed);
  *_grad_fp32     the same with fp32 gradient accumulation (bf16 builds reduce fp32 then);
  adamw_zero1_clip    with an active clip (the norm scales every gradient): norms and
      parameters bit for bit;
  checkpoint_*    after 3 steps the distributed checkpoint (state gathered from the shards
      and owners) is byte for byte the reference's; a distributed model loading the
      reference's 1-rank file continues exactly as the reference does (resume across rank
      counts and zero modes).
Mutations: DATA_PARALLEL_MUTATION_SKIP_MUON (the last rank skips its Muon share) and
DATA_PARALLEL_MUTATION_REDUCE_ROOT (gradients reduced to the wrong rank) each fail cases here
when N > 1 (COMM_MUTATION_NO_AVERAGE, a mean that forgets 1/N, is test_comm's: the gradients
are summed, not averaged).
*/
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/model/parameters.h"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

static Comm* g_comm = nullptr;

static std::vector<ParamSpec> test_spec() {
    // name, shape, matrix group, init std, init value
    return {
        {"wte", {37, 24}, false, 0.02f, 0.0f},   // 888: not a multiple of 64
        {"gain0", {24}, false, 0.0f, 1.0f},
        {"wq", {24, 24}, true, 0.05f, 0.0f},
        {"wk", {24, 8}, true, 0.05f, 0.0f},      // tall
        {"gate", {1}, false, 0.0f, 0.5f},
        {"wv", {24, 8}, true, 0.05f, 0.0f},
        {"wup", {24, 40}, true, 0.05f, 0.0f},    // wide
        {"wdown", {40, 24}, true, 0.05f, 0.0f},
        {"wq1", {24, 24}, true, 0.05f, 0.0f},
        {"gain1", {24}, false, 0.0f, 1.0f},
        {"wo", {33, 17}, true, 0.05f, 0.0f},
    };
}

// Rank r's gradient at step k in the device layout (zeros in the gaps).
static std::vector<float> local_gradient(const ModelParameters& m, int r, int k, float scale) {
    std::vector<float> g(m.device_elements, 0.0f);
    std::mt19937 rng(1000u * (uint32_t)r + (uint32_t)k);
    std::normal_distribution<float> normal(0.0f, scale);
    for (const ParamSpec& s : m.spec) {
        for (int64_t i = 0; i < s.numel(); i++) { g[s.offset + i] = normal(rng); }
    }
    return g;
}

template <typename T>
static void upload(T* device, const std::vector<float>& values) {
    std::vector<T> converted(values.size());
    for (size_t i = 0; i < values.size(); i++) { converted[i] = from_float<T>(values[i]); }
    cudaCheck(cudaMemcpy(device, converted.data(), converted.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// The host stand-in's sum over ranks of values already in T (llmc/parallel/comm.h), written out
// here from its definition: pairwise by rank, (g0 + g1) + (g2 + g3), (g0 + g1) + g2 for three,
// every sum rounded into T (the root's rounding is the result's).
template <typename T>
static float pairwise_by_rank(std::vector<float> level) {
    while (level.size() > 1) {
        std::vector<float> next;
        for (size_t i = 0; i < level.size(); i += 2) {
            next.push_back(i + 1 < level.size() ? to_float(from_float<T>(level[i] + level[i + 1])) : level[i]);
        }
        level = next;
    }
    return level[0];
}

// Sets rank `r`'s gradient (sum: the sum over all ranks) into m's gradient buffer.
template <typename T>
static void set_gradient(ModelParameters& m, T* device, int r, int k, float scale, bool sum) {
    const int N = g_comm->world;
    std::vector<float> g = local_gradient(m, r, k, scale);
    std::vector<T> typed(g.size());
    if (!sum) {
        for (size_t i = 0; i < g.size(); i++) { typed[i] = from_float<T>(g[i]); }
    } else {
        std::vector<std::vector<float>> all;
        for (int q = 0; q < N; q++) { all.push_back(local_gradient(m, q, k, scale)); }
        std::vector<float> parts(N);
        for (size_t i = 0; i < g.size(); i++) {
            for (int q = 0; q < N; q++) { parts[q] = to_float(from_float<T>(all[q][i])); }
            typed[i] = from_float<T>(pairwise_by_rank<T>(parts));
        }
    }
    cudaCheck(cudaMemcpy(device, typed.data(), typed.size() * sizeof(T), cudaMemcpyHostToDevice));
}

static OptimizerConfig make_opt(OptimizerKind optimizer, double clip) {
    OptimizerConfig opt;
    opt.optimizer = optimizer;
    opt.lr = 0.01;
    opt.lr_other = 0.003;
    opt.grad_clip = clip;
    opt.weight_decay = 0.1;
    opt.ns_fp32 = 1;
    return opt;
}

static std::vector<float> params_of(const ModelParameters& m) {
    std::vector<floatX> p = copy_from_device(m.params, m.device_elements);
    std::vector<float> out(p.size());
    for (size_t i = 0; i < p.size(); i++) { out[i] = to_float(p[i]); }
    return out;
}

static std::vector<char> read_file_bytes(const std::string& path) {
    std::vector<char> bytes;
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) { return bytes; }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) { bytes.insert(bytes.end(), buf, buf + n); }
    fclose(f);
    return bytes;
}

static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Pair {
    ModelParameters dist, ref;
    bool fp32_grads;
    bool overlap = false;  // reduce two layer-like buckets early (reduce_early), the rest in update
    Pair(const OptimizerConfig& opt, int zero, bool fp32_grads) : dist(test_spec()), ref(test_spec()), fp32_grads(fp32_grads) {
        dist.init_parameters(7);
        ref.init_parameters(7);
        dist.distribute(*g_comm, zero);
        dist.build_optimizer(opt);
        ref.build_optimizer(opt);
        if (fp32_grads) {
            dist.accumulate_in_fp32();
            ref.accumulate_in_fp32();
        }
    }
    // one step on both; returns the two norms
    std::pair<float, float> step(const OptimizerConfig& opt, int k, float scale) {
        if (fp32_grads && dist.grads_fp32 != nullptr) {
            set_gradient(dist, dist.grads_fp32, g_comm->rank, k, scale, false);
            set_gradient(ref, ref.grads_fp32, g_comm->rank, k, scale, true);
        } else {
            set_gradient(dist, dist.grads, g_comm->rank, k, scale, false);
            set_gradient(ref, ref.grads, g_comm->rank, k, scale, true);
        }
        if (overlap) {  // tensors 2-4 and 5-8, as backward() would hand over two layers (last first)
            auto end = [&](int t) { return dist.spec[t].offset + (size_t)dist.spec[t].numel(); };
            dist.optimizer->reduce_early(dist.spec[5].offset, end(8), dist.stream);
            dist.optimizer->reduce_early(dist.spec[2].offset, end(4), dist.stream);
            CHECK_EQ(dist.optimizer->early_ranges(), (size_t)(g_comm->world > 1 && !fp32_grads ? 2 : 0));
        }
        float a = dist.update(opt.lr, opt.lr_other), b = ref.update(opt.lr, opt.lr_other);
        cudaCheck(cudaDeviceSynchronize());
        return {a, b};
    }
};

// This rank's state buffer `got` (DataParallel's layout for `which`) against the
// reference's full-layout buffer, bit for bit on every piece this rank keeps.
static void check_owned_state(const DataParallel& dp, const float* got, const float* ref_full, size_t elements,
                              DataParallel::State which, const char* what) {
    if (got == nullptr || ref_full == nullptr) {
        testing::report_failure(__FILE__, __LINE__, (std::string(what) + ": a buffer is missing").c_str());
        return;
    }
    std::vector<float> ref = copy_from_device(ref_full, elements);
    if (dp.zero() == 0) {  // full layout: the AdamW tensors everywhere, a matrix at its owner
        std::vector<float> all = copy_from_device(got, elements);
        for (const DataParallel::Piece& p : dp.pieces()) {
            if ((which == DataParallel::State::Muon) != p.muon || (p.owner >= 0 && p.owner != dp.rank())) { continue; }
            if (memcmp(all.data() + p.begin, ref.data() + p.begin, (p.end - p.begin) * sizeof(float)) != 0) {
                testing::report_failure(__FILE__, __LINE__, (std::string(what) + ": differs from the reference").c_str());
                return;
            }
        }
        return;
    }
    size_t mine = 0;
    for (const DataParallel::Piece& p : dp.pieces()) {
        if (p.owner >= 0 && p.owner != dp.rank()) { continue; }
        if (which != DataParallel::State::Master && (which == DataParallel::State::Muon) != p.muon) { continue; }
        size_t at = which == DataParallel::State::Master && p.muon ? dp.state_elements() + p.state : p.state;
        std::vector<float> piece(p.end - p.begin);
        cudaCheck(cudaMemcpy(piece.data(), got + at, piece.size() * sizeof(float), cudaMemcpyDeviceToHost));
        if (memcmp(piece.data(), ref.data() + p.begin, piece.size() * sizeof(float)) != 0) {
            char msg[200];
            snprintf(msg, sizeof(msg), "%s: tensor %d [%zu, %zu) differs from the reference", what, p.tensor, p.begin, p.end);
            testing::report_failure(__FILE__, __LINE__, msg);
            return;
        }
        mine += p.end - p.begin;
    }
    CHECK(mine > 0 || g_comm->world > 2);
}

static void check_steps(OptimizerKind optimizer, int zero, bool fp32_grads, bool overlap = false) {
    OptimizerConfig opt = make_opt(optimizer, 0.0);
    Pair p(opt, zero, fp32_grads);
    p.overlap = overlap;
    for (int k = 1; k <= 5; k++) {
        auto norms = p.step(opt, k, 0.01f);
        // the same bits in every zero mode (the squares per 64-element unit, added in one order)
        if (norms.first != norms.second) {
            char msg[160];
            snprintf(msg, sizeof(msg), "step %d: gradient norm %.9g, the reference's %.9g", k, norms.first, norms.second);
            testing::report_failure(__FILE__, __LINE__, msg);
        }
        if (!same_bits(params_of(p.dist), params_of(p.ref))) {
            std::vector<float> a = params_of(p.dist), b = params_of(p.ref);
            CHECK_CLOSE("parameters (bitwise expected)", a.data(), b.data(), a.size(), 0.0, 0.0);
            return;
        }
    }
    // the state each rank keeps equals the reference's where it owns it
    const ParamOptimizer& d = *p.dist.optimizer;
    const ParamOptimizer& r = *p.ref.optimizer;
    const DataParallel& dp = d.data_parallel();
    const size_t E = p.ref.device_elements;
    check_owned_state(dp, d.adam_m(), r.adam_m(), E, DataParallel::State::AdamW, "AdamW m");
    check_owned_state(dp, d.adam_v(), r.adam_v(), E, DataParallel::State::AdamW, "AdamW v");
    if (opt.is_muon()) { check_owned_state(dp, d.muon_momentum(), r.muon_momentum(), E, DataParallel::State::Muon, "momentum"); }
    if (p.ref.master != nullptr) {
        if (zero == 1) {
            CHECK(p.dist.master == nullptr && d.shards_master());
            check_owned_state(dp, d.master_shard(), p.ref.master, E, DataParallel::State::Master, "master weights");
        } else {
            CHECK(p.dist.master != nullptr);
        }
    }
}

TEST_CASE(adamw_zero0) { check_steps(OptimizerKind::AdamW, 0, false); }
TEST_CASE(adamw_zero1) { check_steps(OptimizerKind::AdamW, 1, false); }
TEST_CASE(muon_zero0) { check_steps(OptimizerKind::Muon, 0, false); }
TEST_CASE(muon_zero1) { check_steps(OptimizerKind::Muon, 1, false); }
TEST_CASE(adamw_zero1_grad_fp32) { check_steps(OptimizerKind::AdamW, 1, true); }
TEST_CASE(muon_zero1_grad_fp32) { check_steps(OptimizerKind::Muon, 1, true); }
TEST_CASE(overlap_adamw_zero0) { check_steps(OptimizerKind::AdamW, 0, false, true); }
TEST_CASE(overlap_adamw_zero1) { check_steps(OptimizerKind::AdamW, 1, false, true); }
TEST_CASE(overlap_muon_zero0) { check_steps(OptimizerKind::Muon, 0, false, true); }
TEST_CASE(overlap_muon_zero1) { check_steps(OptimizerKind::Muon, 1, false, true); }

// Bytes of optimizer state per rank: ZeRO-1 divides it by N up to one matrix (ownership
// is by whole matrices) and the 64-element rounding of each tensor.
static void check_state_bytes(OptimizerKind optimizer) {
    OptimizerConfig opt = make_opt(optimizer, 0.0);
    ModelParameters one(test_spec()), dist(test_spec());
    one.build_optimizer(opt);
    dist.distribute(*g_comm, 1);
    dist.build_optimizer(opt);
    const size_t full = one.optimizer->state_bytes(), mine = dist.optimizer->state_bytes();
    const int N = g_comm->world;
    size_t largest = 0;
    for (const ParamSpec& s : one.spec) { largest = std::max(largest, (size_t)s.numel()); }
    // at most m, v and a master weight per element; the shared tail of the flat chunks (AdamW)
    const size_t slack = (largest + 64 * one.spec.size() + 64 * (size_t)N) * 3 * sizeof(float);
    std::vector<double> all(N, 0.0);
    all[g_comm->rank] = (double)mine;
    g_comm->sum(all);
    printf("    %s optimizer state per rank: 1 rank %zu bytes; %d ranks (ZeRO-1):", opt.name(), full, N);
    for (double b : all) { printf(" %.0f", b); }
    printf(" bytes\n");
    CHECK(mine <= full / N + slack);
    if (N > 1) { CHECK(mine < full); }
}
TEST_CASE(state_bytes_adamw) { check_state_bytes(OptimizerKind::AdamW); }
TEST_CASE(state_bytes_muon) { check_state_bytes(OptimizerKind::Muon); }

TEST_CASE(adamw_zero1_clip) {
    OptimizerConfig opt = make_opt(OptimizerKind::AdamW, 1.0);
    Pair p(opt, 1, false);
    for (int k = 1; k <= 5; k++) {
        auto norms = p.step(opt, k, 0.5f);  // norm ~ 0.5 sqrt(#elements) >> 1: clipped
        CHECK(norms.second > 1.0f);
        CHECK_EQ(norms.first, norms.second);
    }
    std::vector<float> a = params_of(p.dist), b = params_of(p.ref);
    CHECK(same_bits(a, b));
}

// Both checkpoints after 3 steps, written by rank 0 to files; byte for byte equal.
static void check_checkpoint(OptimizerKind optimizer, int zero) {
    OptimizerConfig opt = make_opt(optimizer, 1.0);
    Pair p(opt, zero, false);
    for (int k = 1; k <= 3; k++) { p.step(opt, k, 0.01f); }
    char dir[] = "/tmp/test_data_parallel_XXXXXX";
    std::string base;
    if (g_comm->is_main()) {
        if (mkdtemp(dir) == nullptr) { fatal("mkdtemp failed"); }
        base = dir;
    }
    std::vector<char> path_buf(256, 0);
    snprintf(path_buf.data(), path_buf.size(), "%s", base.c_str());
    g_comm->broadcast_host(path_buf.data(), path_buf.size(), 0);
    base = path_buf.data();
    auto no_config = [](TensorFileWriter&) {};
    p.dist.write_checkpoint(base + "/dist.bin", {}, no_config);
    if (g_comm->is_main()) { p.ref.write_checkpoint(base + "/ref.bin", {}, no_config); }
    g_comm->barrier();
    std::vector<char> a = read_file_bytes(base + "/dist.bin"), b = read_file_bytes(base + "/ref.bin");
    CHECK(!a.empty() && a == b);
    // a distributed model resumes from the 1-rank file and continues as the reference does
    TensorFileReader r(base + "/ref.bin", TENSOR_FILE_CHECKPOINT);
    Pair q(opt, zero, false);
    q.dist.load_parameters(r, true);
    q.ref.load_parameters(r, true);
    for (int k = 4; k <= 6; k++) {
        auto norms = q.step(opt, k, 0.01f);
        CHECK_EQ(norms.first, norms.second);
    }
    std::vector<float> x = params_of(q.dist), y = params_of(q.ref);
    CHECK(same_bits(x, y));
    g_comm->barrier();
    if (g_comm->is_main()) {
        unlink((base + "/dist.bin").c_str());
        unlink((base + "/ref.bin").c_str());
        rmdir(base.c_str());
    }
}

TEST_CASE(checkpoint_adamw_zero0) { check_checkpoint(OptimizerKind::AdamW, 0); }
TEST_CASE(checkpoint_adamw_zero1) { check_checkpoint(OptimizerKind::AdamW, 1); }
TEST_CASE(checkpoint_muon_zero1) { check_checkpoint(OptimizerKind::Muon, 1); }

int main(int argc, char** argv) {
    Comm comm(&argc, &argv);
    g_comm = &comm;
    printf("test_data_parallel: rank %d of %d (%s)%s\n", comm.rank, comm.world, comm.executor(),
           comm.world == 1 ? ": one rank; run under mpirun -np 2 to test the distribution" : "");
    if (!comm.is_main() && freopen("/dev/null", "w", stdout) == nullptr) { fatal("cannot silence rank %d", comm.rank); }
    int status = testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr);
    double failed = comm.sum(status != 0 ? 1.0 : 0.0);
    if (comm.is_main() && failed > 0) { printf("test_data_parallel: %.0f of %d ranks failed\n", failed, comm.world); }
    return failed > 0 ? 1 : 0;
}
