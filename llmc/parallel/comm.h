/*
Processes and collectives for data-parallel training: one process per GPU, started by mpirun (or
srun); a plain start is a 1-rank run on the same code path. Comm comm(&argc, &argv) gives rank,
world, local_rank (which picks the GPU) and is_main() (rank 0: prints, logs, checkpoints); its
collectives (all_reduce, reduce_scatter, all_gather, reduce, broadcast on device buffers in
stream order; sum, max on host doubles) are described where they are declared. The executor is
NCCL in a GPU build (MULTI_GPU); else, with MPI (USE_MPI), a host stand-in that sums in fp32
pairwise by rank (llmc/parallel/sum_order.h), the same bits on every rank; else one rank.
Launching, the executors and their tests: doc/multi-gpu.md "Launching", "Executors".
*/
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/cuda_common.h"
#include "llmc/parallel/sum_order.h"  // defines: pairwise_plan, pairwise_sum (the order of the sums)
#include "llmc/utils.h"

#if defined(USE_MPI)
#include <mpi.h>
#endif
#if defined(MULTI_GPU) && defined(__CUDACC__)
#include <nccl.h>
#define COMM_NCCL 1
#else
#define COMM_NCCL 0
#endif

#if defined(USE_MPI)
#define mpiCheck(call)                                                                             \
    do {                                                                                           \
        int mpi_status_ = (call);                                                                  \
        if (mpi_status_ != MPI_SUCCESS) {                                                          \
            char mpi_text_[MPI_MAX_ERROR_STRING];                                                  \
            int mpi_len_ = 0;                                                                      \
            MPI_Error_string(mpi_status_, mpi_text_, &mpi_len_);                                   \
            fatal("MPI error at %s:%d: %s", __FILE__, __LINE__, mpi_text_);                        \
        }                                                                                          \
    } while (0)
#endif
#if COMM_NCCL
#define ncclCheck(call)                                                                            \
    do {                                                                                           \
        ncclResult_t nccl_status_ = (call);                                                        \
        if (nccl_status_ != ncclSuccess) {                                                         \
            fatal("NCCL error at %s:%d: %s", __FILE__, __LINE__, ncclGetErrorString(nccl_status_)); \
        }                                                                                          \
    } while (0)
#endif

enum class ReduceOp { Sum, Avg };

// Whether an MPI starter launched this process: one of the starters' variables is set
// (OMPI_COMM_WORLD_SIZE: Open MPI's mpirun; PMI_SIZE: MPICH/Hydra and Slurm PMI-2; PMIX_RANK:
// PMIx, srun --mpi=pmix). Otherwise MPI is not initialised at all (a singleton MPI_Init can be
// slow or fail where no MPI daemon may start).
inline bool launched_by_mpi() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
        if (getenv(name) != nullptr) { return true; }
    }
    return false;
}

// What a GPU build says on a machine where the CUDA runtime finds no GPU (`why`: its error, or
// that it counts none), for the program at `argv0`: the host-backend build runs here. (A function
// of its own, outside the GPU-only code, so the host tests check its text.)
inline std::string no_gpu_message(const char* why, const char* argv0) {
    std::string name = argv0 == nullptr ? "train_san" : argv0;
    name = name.substr(name.find_last_of('/') + 1);
    return std::string("no GPU here (") + why + "): this is a GPU build of " + name + "; on this machine run the "
           "host-backend build, build/host-" + PRECISION_NAME + "/" + name + " (make builds it)";
}

class Comm {
public:
    int rank = 0, world = 1;
    int local_rank = 0, local_world = 1;  // index and count of the ranks on this node

    // Starts MPI when launched by an MPI starter; on the GPU, picks device local_rank and
    // sets up NCCL.
    Comm(int* argc, char*** argv) {
        if (launched_by_mpi()) {
#if defined(USE_MPI)
            mpiCheck(MPI_Init(argc, argv));
            mpi_ = true;
            mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
            mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world));
            MPI_Comm node;
            mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
            mpiCheck(MPI_Comm_rank(node, &local_rank));
            mpiCheck(MPI_Comm_size(node, &local_world));
            mpiCheck(MPI_Comm_free(&node));
#else
            const char* size = getenv("OMPI_COMM_WORLD_SIZE");
            if (size == nullptr) { size = getenv("PMI_SIZE"); }
            if (size != nullptr && atoi(size) > 1) {
                fatal("launched as one of %s processes, but this binary was built without MPI (install "
                      "libopenmpi-dev and run make again: it rebuilds what was built without MPI; or run it "
                      "without mpirun)", size);
            }
#endif
        }
        (void)argc;
        (void)argv;
#if !HOST_BACKEND
        int devices = 0;
        const cudaError_t found = cudaGetDeviceCount(&devices);
        if (found != cudaSuccess || devices == 0) {
            fatal("%s", no_gpu_message(found != cudaSuccess ? cudaGetErrorString(found) : "the CUDA runtime counts 0 devices",
                                       argv != nullptr && *argv != nullptr ? (*argv)[0] : nullptr).c_str());
        }
        if (local_world > devices) {
            fatal("%d ranks on this node but %d GPUs: start one process per GPU", local_world, devices);
        }
        cudaCheck(cudaSetDevice(local_rank));
#endif
#if COMM_NCCL
        if (starts_nccl(world)) {
            ncclUniqueId id;
            if (rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
            broadcast_host(&id, sizeof(id), 0);
            ncclCheck(ncclCommInitRank(&nccl_, world, id, rank));
        }
#else
        if (world > 1 && !HOST_BACKEND) {
            fatal("%d ranks, but this GPU build has no NCCL (nccl.h was not found at build time): rebuild with "
                  "NCCL for multi-GPU runs", world);
        }
#endif
    }
    ~Comm() {
#if COMM_NCCL
        if (nccl_ != nullptr) { ncclCommDestroy(nccl_); }
#endif
#if defined(USE_MPI)
        if (mpi_) { MPI_Finalize(); }
#endif
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;

    bool is_main() const { return rank == 0; }
    // Whether a run of `world` ranks needs NCCL (in builds that have it): only when there is
    // something to exchange. Every collective returns early at world 1, and NCCL's bootstrap
    // (sockets, a network interface) can stop a single-GPU run on an offline machine before
    // its first step.
    static bool needs_nccl(int world) { return world > 1; }
    static bool starts_nccl(int world) { return COMM_NCCL && needs_nccl(world); }
    bool nccl_started() const {
#if COMM_NCCL
        return nccl_ != nullptr;
#else
        return false;
#endif
    }
    // "NCCL", "MPI stand-in" or "single process": what moves the data.
    const char* executor() const { return nccl_started() ? "NCCL" : (mpi_ ? "MPI stand-in" : "single process"); }

    // Collectives on device buffers, in stream order (T = float or __nv_bfloat16).
    // x <- sum (op Sum) or mean (op Avg) over ranks, on every rank.
    template <typename T>
    void all_reduce(T* x, size_t n, ReduceOp op, cudaStream_t stream) {
        check_type<T>();
        if (world == 1) { return; }
#if COMM_NCCL
        ncclCheck(ncclAllReduce(x, x, n, nccl_type<T>(), nccl_op(op), nccl_, stream));
#else
        (void)stream;
        // ranks sum the parts [part_begin(r), part_begin(r+1)) of x, then share them
        std::vector<size_t> begin(world + 1);
        for (int r = 0; r <= world; r++) { begin[r] = n * (size_t)r / (size_t)world; }
        reduce_parts(x + begin[rank], x, begin, op);
        gather_parts(x, begin);
#endif
    }

    // in: world x chunk elements on every rank; rank r gets out = sum/mean over ranks of
    // in[r*chunk, (r+1)*chunk).
    template <typename T>
    void reduce_scatter(T* out, const T* in, size_t chunk, ReduceOp op, cudaStream_t stream) {
        check_type<T>();
        if (world == 1) {
            if (out != in) { cudaCheck(cudaMemcpyAsync(out, in, chunk * sizeof(T), cudaMemcpyDeviceToDevice, stream)); }
            return;
        }
#if COMM_NCCL
        ncclCheck(ncclReduceScatter(in, out, chunk, nccl_type<T>(), nccl_op(op), nccl_, stream));
#else
        (void)stream;
        std::vector<size_t> begin(world + 1);
        for (int r = 0; r <= world; r++) { begin[r] = chunk * (size_t)r; }
        reduce_parts(out, in, begin, op);
#endif
    }

    // In place: rank r contributes x[r*chunk, (r+1)*chunk) and every rank ends with all world
    // chunks.
    template <typename T>
    void all_gather(T* x, size_t chunk, cudaStream_t stream) {
        check_type<T>();
        if (world == 1) { return; }
#if COMM_NCCL
        ncclCheck(ncclAllGather(x + (size_t)rank * chunk, x, chunk, nccl_type<T>(), nccl_, stream));
#else
        (void)stream;
        std::vector<size_t> begin(world + 1);
        for (int r = 0; r <= world; r++) { begin[r] = chunk * (size_t)r; }
        gather_parts(x, begin);
#endif
    }

    // root's x <- sum/mean over ranks; the other ranks' x is left as it was.
    // Only the root gets the result (the Muon owner of a matrix, the rank that updates an
    // AdamW piece); the host stand-in sums exactly as all_reduce does, so the root's bits
    // equal the all-reduce's.
    template <typename T>
    void reduce(T* x, size_t n, int root, ReduceOp op, cudaStream_t stream) {
        check_type<T>();
        if (world == 1) { return; }
        if (root < 0 || root >= world) { fatal("reduce: root %d is not a rank of %d", root, world); }
#if COMM_NCCL
        ncclCheck(ncclReduce(x, x, n, nccl_type<T>(), nccl_op(op), root, nccl_, stream));
#else
        (void)stream;
        reduce_to_root(x, n, root, op);
#endif
    }

    // x <- root's x.
    template <typename T>
    void broadcast(T* x, size_t n, int root, cudaStream_t stream) {
        check_type<T>();
        if (world == 1) { return; }
#if COMM_NCCL
        ncclCheck(ncclBroadcast(x, x, n, nccl_type<T>(), root, nccl_, stream));
#else
        (void)stream;
        broadcast_host(x, n * sizeof(T), root);
#endif
    }

    // Several collectives between group_start() and group_end() (broadcasts from different
    // roots, reduces) as one batch (NCCL: one group, so they overlap); the host stand-in runs
    // them in order.
    void group_start() {
#if COMM_NCCL
        if (world > 1) { ncclCheck(ncclGroupStart()); }
#endif
    }
    void group_end() {
#if COMM_NCCL
        if (world > 1) { ncclCheck(ncclGroupEnd()); }
#endif
    }

    // Host scalars over ranks (metrics, token counts): gathered and combined in rank order, so
    // every rank gets the same bits.
    double sum(double value) const {
        double total = 0.0;
        for (double v : gather_scalars(value)) { total += v; }
        return total;
    }
    // Element-wise sum of a host vector over ranks (same length everywhere), in place.
    void sum(std::vector<double>& values) const {
        if (world == 1 || values.empty()) { return; }
#if defined(USE_MPI)
        std::vector<double> all(values.size() * (size_t)world);
        mpiCheck(MPI_Allgather(values.data(), (int)values.size(), MPI_DOUBLE, all.data(), (int)values.size(), MPI_DOUBLE,
                               MPI_COMM_WORLD));
        for (size_t i = 0; i < values.size(); i++) {
            double total = 0.0;
            for (int r = 0; r < world; r++) { total += all[(size_t)r * values.size() + i]; }
            values[i] = total;
        }
#endif
    }
    double max(double value) const {
        std::vector<double> all = gather_scalars(value);
        return *std::max_element(all.begin(), all.end());
    }

    void barrier() const {
#if defined(USE_MPI)
        if (mpi_) { mpiCheck(MPI_Barrier(MPI_COMM_WORLD)); }
#endif
    }

    // Bytes of host memory from root to every rank (the NCCL id; settings rank 0 read).
    void broadcast_host(void* data, size_t bytes, int root) const {
        if (world == 1) { return; }
#if defined(USE_MPI)
        char* p = static_cast<char*>(data);
        for (size_t done = 0; done < bytes; done += kMaxMessage) {
            int piece = (int)std::min(kMaxMessage, bytes - done);
            mpiCheck(MPI_Bcast(p + done, piece, MPI_BYTE, root, MPI_COMM_WORLD));
        }
#else
        (void)data;
        (void)bytes;
        (void)root;
#endif
    }

private:
    static constexpr size_t kMaxMessage = size_t(1) << 30;  // bytes per MPI call (counts are int)

    template <typename T>
    static void check_type() {
        static_assert(std::is_same<T, float>::value || std::is_same<T, __nv_bfloat16>::value,
                      "collectives move float or __nv_bfloat16");
    }

    std::vector<double> gather_scalars(double value) const {
        std::vector<double> all(world, value);
#if defined(USE_MPI)
        if (world > 1) { mpiCheck(MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD)); }
#endif
        return all;
    }

#if COMM_NCCL
    template <typename T>
    static ncclDataType_t nccl_type() {
        return std::is_same<T, float>::value ? ncclFloat32 : ncclBfloat16;
    }
    static ncclRedOp_t nccl_op(ReduceOp op) {
#if defined(COMM_MUTATION_NO_AVERAGE)  // (tests only: Avg returns the sum, the bug a forgotten division
                                       // by the world size would be; the multi-rank tests must fail)
        (void)op;
        return ncclSum;
#else
        return op == ReduceOp::Avg ? ncclAvg : ncclSum;
#endif
    }
    ncclComm_t nccl_ = nullptr;
#else
    // out[i] = the sum (or mean) over ranks q of in_q[begin[rank] + i], i < begin[rank+1] -
    // begin[rank]: every rank sends part r of its input to rank r (MPI_Alltoallv), which
    // adds the world copies pairwise by rank (pairwise_sum) in fp32. in and out may overlap.
    template <typename T>
    void reduce_parts(T* out, const T* in, const std::vector<size_t>& begin, ReduceOp op) const {
#if defined(USE_MPI)
        const size_t mine = begin[rank + 1] - begin[rank];
        // in slices small enough for int byte counts: slice s holds elements [s*step, ...) of every part
        size_t longest = 0;
        for (int r = 0; r < world; r++) { longest = std::max(longest, begin[r + 1] - begin[r]); }
        const size_t step = std::max<size_t>(1, kMaxMessage / ((size_t)world * sizeof(T)));
        std::vector<T> received;
        const std::vector<std::pair<int, int>> plan = pairwise_plan(world);
        std::vector<float> work(world);
        std::vector<int> send_counts(world), send_displs(world), recv_counts(world), recv_displs(world);
        for (size_t from = 0; from < longest; from += step) {
            size_t recv_each = from < mine ? std::min(step, mine - from) : 0;
            // this slice of every part, packed back to back (a copy, so in and out may overlap)
            std::vector<T> outgoing;
            for (int r = 0; r < world; r++) {
                size_t part = begin[r + 1] - begin[r];
                size_t count = from < part ? std::min(step, part - from) : 0;
                send_counts[r] = (int)(count * sizeof(T));
                send_displs[r] = (int)(outgoing.size() * sizeof(T));
                recv_counts[r] = (int)(recv_each * sizeof(T));
                recv_displs[r] = (int)(r * recv_each * sizeof(T));
                outgoing.insert(outgoing.end(), in + begin[r] + from, in + begin[r] + from + count);
            }
            received.assign(recv_each * world, T());
            mpiCheck(MPI_Alltoallv(outgoing.data(), send_counts.data(), send_displs.data(), MPI_BYTE, received.data(),
                                   recv_counts.data(), recv_displs.data(), MPI_BYTE, MPI_COMM_WORLD));
            for (size_t i = 0; i < recv_each; i++) {
                out[from + i] = finish_sum<T>(pairwise_sum(received.data() + i, recv_each, plan, work.data(), world), op);
            }
        }
#else
        (void)out;
        (void)in;
        (void)begin;
        (void)op;
#endif
    }

    // root's x[i] = the sum (or mean) over ranks pairwise by rank, as reduce_parts sums: every
    // rank's copy is gathered at the root (MPI_Gather, in slices for int counts).
    template <typename T>
    void reduce_to_root(T* x, size_t n, int root, ReduceOp op) const {
#if defined(USE_MPI)
        const size_t step = std::max<size_t>(1, kMaxMessage / ((size_t)world * sizeof(T)));
        std::vector<T> received;
        const std::vector<std::pair<int, int>> plan = pairwise_plan(world);
        std::vector<float> work(world);
        for (size_t from = 0; from < n; from += step) {
            const size_t count = std::min(step, n - from);
            if (rank == root) { received.assign(count * world, T()); }
            mpiCheck(MPI_Gather(x + from, (int)(count * sizeof(T)), MPI_BYTE, rank == root ? received.data() : nullptr,
                                (int)(count * sizeof(T)), MPI_BYTE, root, MPI_COMM_WORLD));
            if (rank != root) { continue; }
            for (size_t i = 0; i < count; i++) {
                x[from + i] = finish_sum<T>(pairwise_sum(received.data() + i, count, plan, work.data(), world), op);
            }
        }
#else
        (void)x;
        (void)n;
        (void)root;
        (void)op;
#endif
    }
    // The fp32 root of the sum into T: the mean is the root times 1/N, rounded once.
    template <typename T>
    T finish_sum(float total, ReduceOp op) const {
#if defined(COMM_MUTATION_NO_AVERAGE)
        (void)op;
        return from_float<T>(total);
#else
        return from_float<T>(op == ReduceOp::Avg ? total * (1.0f / (float)world) : total);
#endif
    }

    // In place: rank r holds x[begin[r], begin[r+1]); afterwards every rank holds all parts.
    template <typename T>
    void gather_parts(T* x, const std::vector<size_t>& begin) const {
#if defined(USE_MPI)
        for (int r = 0; r < world; r++) {
            size_t part = begin[r + 1] - begin[r];
            broadcast_host(x + begin[r], part * sizeof(T), r);
        }
#else
        (void)x;
        (void)begin;
#endif
    }
#endif

    bool mpi_ = false;
};
