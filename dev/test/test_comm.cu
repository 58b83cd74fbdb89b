/*
test_comm: the collectives of llmc/parallel/comm.h and the work-splitting rules of llmc/parallel/sharding.h.
Run as N ranks (`scripts/mpirun.sh -np 2 build/host-fp32/test_comm`, as `make test` does;
plain: one rank, where the collectives are identities and only that is checked).

  no_gpu_*         the message of a GPU build that finds no GPU: the host build to run;
  sum_*, avg_*     all_reduce in fp32 and bf16 of data whose sums are exact in the type
                   (multiples of 1/16 below 2^4: at most 8 significant bits), against the
                   exact sum computed here from every rank's data (each rank can regenerate
                   any rank's inputs); sizes that do not divide by N, 1 and 0 elements;
  order_*          random data: the host stand-in's result is bit for bit the fp32 sum
                   pairwise by rank (inner sums rounded into T), written out here (the
                   property that makes a run repeat exactly and equal its gradient groups on
                   1 rank: llmc/parallel/grad_groups.h), and every rank holds the same bits;
  reduce_scatter_*, all_gather_*, broadcast_*, scalars_*   the same for the other collectives;
  reduce_*         reduce to each root, grouped: the root gets the all-reduce's bits, the
                   other ranks' buffers stay as they were;
  shards_*         flat_shards: equal aligned chunks and a short shared tail that cover the
                   buffer once, for many sizes and rank counts; pieces_in over the chunks
                   and the tail covers every tensor element exactly once;
  owners_*         balance_owners: one owner per matrix, deterministic, max - min load <= the
                   largest matrix, and within Graham's 4/3 of the optimum (brute force here).
COMM_MUTATION_NO_AVERAGE (a forgotten division by N) makes the avg_* cases fail with N > 1.
*/
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "llmc/parallel/comm.h"
#include "llmc/parallel/sharding.h"
#include "dev/test/compare.h"
#include "dev/test/testing.h"

static Comm* g_comm = nullptr;
static cudaStream_t g_stream = nullptr;

// Rank r's exactly representable input: a multiple of 1/16 in [-2, 2).
static float exact_value(int r, size_t i, int salt) {
    return (float)((int64_t)((i * 7 + (size_t)r * 13 + (size_t)salt * 5) % 64) - 32) / 16.0f;
}
static float random_value(int r, size_t i, int salt) {
    std::mt19937 rng((uint32_t)(r * 1000003 + salt * 7919) ^ (uint32_t)i);
    return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng) * std::ldexp(1.0f, (int)(i % 7) - 3);
}

template <typename T>
static std::vector<T> make_input(int r, size_t n, int salt, bool exact) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; i++) { v[i] = from_float<T>(exact ? exact_value(r, i, salt) : random_value(r, i, salt)); }
    return v;
}

template <typename T>
static std::vector<T> run_all_reduce(const std::vector<T>& host, ReduceOp op) {
    T* d = copy_to_device(host);
    g_comm->all_reduce(d, host.size(), op, g_stream);
    cudaCheck(cudaStreamSynchronize(g_stream));
    std::vector<T> out = copy_from_device(d, host.size());
    cudaFree(d);
    return out;
}

// Whether every rank holds the same bytes as rank 0.
template <typename T>
static bool same_on_every_rank(const std::vector<T>& v) {
    std::vector<T> root = v;
    g_comm->broadcast_host(root.data(), root.size() * sizeof(T), 0);
    int same = root.empty() || memcmp(root.data(), v.data(), v.size() * sizeof(T)) == 0;
    return g_comm->sum(same) == g_comm->world;
}

template <typename T>
static void check_exact_all_reduce(size_t n, ReduceOp op, int salt) {
    const int N = g_comm->world;
    std::vector<T> got = run_all_reduce(make_input<T>(g_comm->rank, n, salt, true), op);
    std::vector<double> expected(n, 0.0);
    for (int r = 0; r < N; r++) {
        for (size_t i = 0; i < n; i++) { expected[i] += exact_value(r, i, salt); }
    }
    // the mean is the exact sum divided by N, rounded once (exact when N is a power of two)
    const double eps = op == ReduceOp::Avg && (N & (N - 1)) != 0 ? (std::is_same<T, float>::value ? 1e-7 : 8e-3) : 0.0;
    for (double& e : expected) { e = op == ReduceOp::Avg ? e / N : e; }
    std::vector<float> got_f(n);
    for (size_t i = 0; i < n; i++) { got_f[i] = to_float(got[i]); }
    CHECK_CLOSE("all_reduce", got_f.data(), expected.data(), n, 0.0, eps);
    CHECK(same_on_every_rank(got));
}

// NCCL is set up only when there is more than one rank (a single-GPU run on an offline
// machine must not stop in NCCL's bootstrap): the decision, and on a GPU build with NCCL the
// communicator this process got.
TEST_CASE(nccl_only_for_several_ranks) {
    CHECK(!Comm::needs_nccl(1));
    CHECK(Comm::needs_nccl(2));
    CHECK(!Comm::starts_nccl(1));
    CHECK_EQ(g_comm->nccl_started(), Comm::starts_nccl(g_comm->world));
    if (g_comm->world == 1) { CHECK(strcmp(g_comm->executor(), "NCCL") != 0); }
}

// A GPU build on a machine without a GPU said only "CUDA driver version is insufficient": it
// names the host-backend build to run instead (the text of Comm's check, which only a GPU build
// reaches).
TEST_CASE(no_gpu_names_the_host_build) {
    const std::string text = no_gpu_message("CUDA driver version is insufficient for CUDA runtime version",
                                            "build/gpu-bf16/train_san");
    CHECK(text == std::string("no GPU here (CUDA driver version is insufficient for CUDA runtime version): this is a "
                              "GPU build of train_san; on this machine run the host-backend build, build/host-") +
                      PRECISION_NAME + "/train_san (make builds it)");
    CHECK(no_gpu_message("x", "./train_gpt2").find("build/host-" PRECISION_NAME "/train_gpt2 (make") != std::string::npos);
}

TEST_CASE(sum_fp32) {
    for (size_t n : {size_t(1001), size_t(1), size_t(0), size_t(64 * 1024 + 3)}) { check_exact_all_reduce<float>(n, ReduceOp::Sum, 1); }
}
TEST_CASE(sum_bf16) {
    for (size_t n : {size_t(1001), size_t(1), size_t(0)}) { check_exact_all_reduce<__nv_bfloat16>(n, ReduceOp::Sum, 2); }
}
TEST_CASE(avg_fp32) {
    for (size_t n : {size_t(1001), size_t(1), size_t(4096)}) { check_exact_all_reduce<float>(n, ReduceOp::Avg, 3); }
}
TEST_CASE(avg_bf16) {
    for (size_t n : {size_t(1001), size_t(7)}) { check_exact_all_reduce<__nv_bfloat16>(n, ReduceOp::Avg, 4); }
}

// The host stand-in's sum: pairwise by rank in fp32, (x0 + x1) + (x2 + x3), (x0 + x1) + x2 for
// three, the inner sums rounded into T and the root once (the mean: the root times 1/N, rounded
// once); NCCL's order is its own, so on NCCL builds only the rounding is bounded.
template <typename T>
static float pairwise_root(std::vector<float> level) {
    while (level.size() > 1) {
        std::vector<float> next;
        for (size_t i = 0; i < level.size(); i += 2) {
            const bool root = level.size() == 2;
            const float sum = i + 1 < level.size() ? level[i] + level[i + 1] : level[i];
            next.push_back(root || i + 1 >= level.size() ? sum : to_float(from_float<T>(sum)));
        }
        level = next;
    }
    return level[0];
}
template <typename T>
static void check_rank_order(size_t n, ReduceOp op) {
    const int N = g_comm->world;
    std::vector<T> got = run_all_reduce(make_input<T>(g_comm->rank, n, 9, false), op);
    std::vector<float> expected(n), got_f(n);
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < N; r++) { inputs.push_back(make_input<T>(r, n, 9, false)); }
    for (size_t i = 0; i < n; i++) {
        std::vector<float> parts(N);
        for (int r = 0; r < N; r++) { parts[r] = to_float(inputs[r][i]); }
        const float total = pairwise_root<T>(parts);
        expected[i] = to_float(from_float<T>(op == ReduceOp::Avg ? total * (1.0f / (float)N) : total));
        got_f[i] = to_float(got[i]);
    }
    const bool exact = !COMM_NCCL;
    CHECK_CLOSE("pairwise sum", got_f.data(), expected.data(), n, 0.0,
                exact ? 0.0 : (std::is_same<T, float>::value ? 1e-6 : 2e-2));
    CHECK(same_on_every_rank(got));
}
TEST_CASE(order_fp32) {
    check_rank_order<float>(3001, ReduceOp::Sum);
    check_rank_order<float>(3001, ReduceOp::Avg);
}
TEST_CASE(order_bf16) {
    check_rank_order<__nv_bfloat16>(3001, ReduceOp::Sum);
    check_rank_order<__nv_bfloat16>(3001, ReduceOp::Avg);
}

template <typename T>
static void check_reduce_scatter(size_t chunk, ReduceOp op) {
    const int N = g_comm->world, me = g_comm->rank;
    std::vector<T> host = make_input<T>(me, chunk * N, 5, true);
    T* in = copy_to_device(host);
    T* out = cudaMallocElements(T, std::max<size_t>(chunk, 1));
    g_comm->reduce_scatter(out, in, chunk, op, g_stream);
    cudaCheck(cudaStreamSynchronize(g_stream));
    std::vector<T> got = copy_from_device(out, chunk);
    std::vector<float> got_f(chunk);
    std::vector<double> expected(chunk, 0.0);
    for (size_t i = 0; i < chunk; i++) {
        for (int r = 0; r < N; r++) { expected[i] += exact_value(r, me * chunk + i, 5); }
        if (op == ReduceOp::Avg) { expected[i] /= N; }
        got_f[i] = to_float(got[i]);
    }
    const double eps = op == ReduceOp::Avg && (N & (N - 1)) != 0 ? (std::is_same<T, float>::value ? 1e-7 : 8e-3) : 0.0;
    CHECK_CLOSE("reduce_scatter", got_f.data(), expected.data(), chunk, 0.0, eps);
    // in place, as ZeRO uses it: out is this rank's chunk of in
    T* inplace = copy_to_device(host);
    g_comm->reduce_scatter(inplace + me * chunk, inplace, chunk, op, g_stream);
    cudaCheck(cudaStreamSynchronize(g_stream));
    std::vector<T> got2 = copy_from_device(inplace + me * chunk, chunk);
    CHECK(memcmp(got2.data(), got.data(), chunk * sizeof(T)) == 0);
    cudaFree(in);
    cudaFree(out);
    cudaFree(inplace);
}
TEST_CASE(reduce_scatter_fp32) {
    check_reduce_scatter<float>(640, ReduceOp::Sum);
    check_reduce_scatter<float>(640, ReduceOp::Avg);
}
TEST_CASE(reduce_scatter_bf16) {
    check_reduce_scatter<__nv_bfloat16>(128, ReduceOp::Sum);
    check_reduce_scatter<__nv_bfloat16>(128, ReduceOp::Avg);
}

template <typename T>
static void check_all_gather(size_t chunk) {
    const int N = g_comm->world, me = g_comm->rank;
    // every rank's buffer holds garbage outside its own chunk
    std::vector<T> host(chunk * N, from_float<T>(-999.0f));
    std::vector<T> mine = make_input<T>(me, chunk, 6, false);
    std::copy(mine.begin(), mine.end(), host.begin() + me * chunk);
    T* d = copy_to_device(host);
    g_comm->all_gather(d, chunk, g_stream);
    cudaCheck(cudaStreamSynchronize(g_stream));
    std::vector<T> got = copy_from_device(d, chunk * N);
    for (int r = 0; r < N; r++) {
        std::vector<T> expected = make_input<T>(r, chunk, 6, false);
        CHECK(memcmp(got.data() + r * chunk, expected.data(), chunk * sizeof(T)) == 0);
    }
    cudaFree(d);
}
TEST_CASE(all_gather_fp32) { check_all_gather<float>(192); }
TEST_CASE(all_gather_bf16) { check_all_gather<__nv_bfloat16>(64); }

TEST_CASE(broadcast_each_root) {
    const int N = g_comm->world;
    for (int root = 0; root < N; root++) {
        std::vector<float> host = make_input<float>(g_comm->rank, 333, 7 + root, false);
        float* d = copy_to_device(host);
        g_comm->broadcast(d, host.size(), root, g_stream);
        cudaCheck(cudaStreamSynchronize(g_stream));
        std::vector<float> got = copy_from_device(d, host.size()), expected = make_input<float>(root, 333, 7 + root, false);
        CHECK(memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0);
        cudaFree(d);
    }
}

// reduce (Muon owners, ZeRO-1 pieces): the root's result is the all-reduce's bits (NCCL:
// its rounding); every other rank's buffer is untouched. Several roots in one group, as
// DataParallel::reduce_gradients issues them, and sizes that are not multiples of anything.
template <typename T>
static void check_reduce(ReduceOp op) {
    const int N = g_comm->world, me = g_comm->rank;
    const size_t sizes[] = {1, 257, 3001};
    std::vector<std::vector<T>> inputs, expected;
    std::vector<T*> d;
    for (int root = 0; root < N; root++) {
        for (size_t n : sizes) {
            inputs.push_back(make_input<T>(me, n, 11 + root, false));
            expected.push_back(run_all_reduce(inputs.back(), op));
            d.push_back(copy_to_device(inputs.back()));
        }
    }
    g_comm->group_start();
    for (size_t k = 0; k < d.size(); k++) { g_comm->reduce(d[k], inputs[k].size(), (int)(k / 3), op, g_stream); }
    g_comm->group_end();
    cudaCheck(cudaStreamSynchronize(g_stream));
    for (size_t k = 0; k < d.size(); k++) {
        const int root = (int)(k / 3);
        std::vector<T> got = copy_from_device(d[k], inputs[k].size());
        const std::vector<T>& want = root == me ? expected[k] : inputs[k];
        if (COMM_NCCL && root == me) {
            std::vector<float> a(got.size()), b(got.size());
            for (size_t i = 0; i < got.size(); i++) { a[i] = to_float(got[i]), b[i] = to_float(want[i]); }
            const double eps = std::is_same<T, float>::value ? 1e-6 : 2e-2;
            CHECK_CLOSE("reduce at the root", a.data(), b.data(), a.size(), 0.0, eps);
        } else {
            CHECK(memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0);
        }
        cudaFree(d[k]);
    }
}
TEST_CASE(reduce_fp32) {
    check_reduce<float>(ReduceOp::Sum);
    check_reduce<float>(ReduceOp::Avg);
}
TEST_CASE(reduce_bf16) {
    check_reduce<__nv_bfloat16>(ReduceOp::Sum);
    check_reduce<__nv_bfloat16>(ReduceOp::Avg);
}

TEST_CASE(scalars) {
    const int N = g_comm->world, me = g_comm->rank;
    CHECK_EQ(g_comm->sum(me + 1.0), N * (N + 1) / 2.0);
    CHECK_EQ(g_comm->max(-(double)me), 0.0);
    CHECK_EQ(g_comm->max((double)me), (double)(N - 1));
    std::vector<double> v3 = {1.0 * me, 2.0, -0.5 * me};
    g_comm->sum(v3);
    CHECK(v3[0] == N * (N - 1) / 2.0 && v3[1] == 2.0 * N && v3[2] == -0.25 * N * (N - 1));
    // rank order: the same bits on every rank even where the order changes the result
    double v = g_comm->sum(me == 0 ? 1.0 : 1e-17);
    CHECK(same_on_every_rank(std::vector<double>{v}));
}

// ---- pure helpers -------------------------------------------------------------------------

TEST_CASE(shards_cover_once) {
    for (int world = 1; world <= 9; world++) {
        for (size_t elements : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(65), size_t(1000), size_t(4096),
                                size_t(123457), size_t(64 * 9 * 7)}) {
            FlatShards s = flat_shards(elements, world, 64);
            CHECK(s.chunk % 64 == 0);
            CHECK(s.tail_begin() <= elements);
            // the largest such chunk: the shared tail is shorter than one aligned piece per rank
            CHECK(elements - s.tail_begin() < (size_t)world * 64);
            size_t covered = 0;
            for (int r = 0; r < world; r++) {
                CHECK(s.begin(r) % 64 == 0);
                CHECK(s.begin(r) == covered);  // contiguous, in rank order, no overlap
                CHECK_EQ(s.end(r) - s.begin(r), s.chunk);
                covered = s.end(r);
            }
            CHECK_EQ(covered, s.tail_begin());
        }
    }
}

TEST_CASE(shards_pieces) {
    // tensors at 64-aligned offsets with gaps, as layout_parameters lays them out
    std::vector<size_t> sizes = {1, 640, 64, 100, 3, 4096, 65, 1};
    std::vector<size_t> offsets;
    size_t at = 0;
    for (size_t n : sizes) {
        offsets.push_back(at);
        at += (n + 63) / 64 * 64;
    }
    for (int world = 1; world <= 7; world++) {
        FlatShards s = flat_shards(at, world, 64);
        std::vector<int> hits(at, 0);
        for (int r = 0; r <= world; r++) {  // every chunk, then (r == world) the tail
            size_t b = r < world ? s.begin(r) : s.tail_begin(), e = r < world ? s.end(r) : at;
            for (const TensorPiece& p : pieces_in(offsets, sizes, b, e)) {
                CHECK(p.begin >= b && p.end <= e);
                CHECK(p.begin >= offsets[p.tensor] && p.end <= offsets[p.tensor] + sizes[p.tensor]);
                for (size_t i = p.begin; i < p.end; i++) { hits[i]++; }
            }
        }
        for (size_t t = 0; t < sizes.size(); t++) {
            for (size_t i = 0; i < at; i++) {
                bool inside = i >= offsets[t] && i < offsets[t] + sizes[t];
                if (inside) { CHECK_EQ(hits[i], 1); }
            }
        }
        size_t total = 0;
        for (int h : hits) { total += h; }
        size_t expected = 0;
        for (size_t n : sizes) { expected += n; }
        CHECK_EQ(total, expected);
    }
}

// The best possible max load, by trying every assignment (small cases only).
static int64_t optimal_max_load(const std::vector<int64_t>& sizes, int world) {
    int64_t best = INT64_MAX;
    std::vector<int64_t> load(world, 0);
    std::function<void(size_t)> place = [&](size_t i) {
        if (i == sizes.size()) {
            best = std::min(best, *std::max_element(load.begin(), load.end()));
            return;
        }
        for (int r = 0; r < world; r++) {
            load[r] += sizes[i];
            place(i + 1);
            load[r] -= sizes[i];
        }
    };
    place(0);
    return best;
}

TEST_CASE(owners_balanced) {
    std::mt19937 rng(17);
    for (int trial = 0; trial < 200; trial++) {
        int world = 1 + trial % 4;
        int count = 1 + (int)(rng() % 7);
        std::vector<int64_t> sizes(count);
        for (int64_t& s : sizes) { s = 64 * (1 + (int64_t)(rng() % 40)); }
        std::vector<int> owner = balance_owners(sizes, world);
        CHECK(owner == balance_owners(sizes, world));
        std::vector<int64_t> load(world, 0);
        for (int i = 0; i < count; i++) {
            CHECK(owner[i] >= 0 && owner[i] < world);
            load[owner[i]] += sizes[i];
        }
        int64_t hi = *std::max_element(load.begin(), load.end()), lo = *std::min_element(load.begin(), load.end());
        CHECK(hi - lo <= *std::max_element(sizes.begin(), sizes.end()));
        int64_t best = optimal_max_load(sizes, world);
        CHECK(3 * hi <= 4 * best);
    }
    // a SAN-like list: 4 layers of d x d (q, o) and d x d/4 (k, v) matrices over 2 ranks
    std::vector<int64_t> san;
    for (int l = 0; l < 4; l++) {
        for (int64_t n : {256 * 256, 256 * 64, 256 * 64, 256 * 256}) { san.push_back(n); }
    }
    std::vector<int> owner = balance_owners(san, 2);
    int64_t load[2] = {0, 0};
    for (size_t i = 0; i < san.size(); i++) { load[owner[i]] += san[i]; }
    CHECK_EQ(load[0], load[1]);
}

int main(int argc, char** argv) {
    Comm comm(&argc, &argv);
    g_comm = &comm;
    cudaCheck(cudaStreamCreate(&g_stream));
    printf("test_comm: rank %d of %d (%s)%s\n", comm.rank, comm.world, comm.executor(),
           comm.world == 1 ? ": collectives are identities here; run under mpirun -np 2 to test them" : "");
    // rank 0 prints the case list; every rank prints its failures (stderr)
    if (!comm.is_main() && freopen("/dev/null", "w", stdout) == nullptr) { fatal("test_comm: cannot silence rank %d", comm.rank); }
    int status = testing::run_all(argv[0], argc > 1 ? argv[1] : nullptr);
    // every rank's verdict: one rank failing fails them all
    double failed = comm.sum(status != 0 ? 1.0 : 0.0);
    if (comm.is_main() && failed > 0) { printf("test_comm: %.0f of %d ranks failed\n", failed, comm.world); }
    return failed > 0 ? 1 : 0;
}
