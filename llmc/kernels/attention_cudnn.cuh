/*
Optional cuDNN attention (GPU builds with USE_CUDNN=1, i.e. -DENABLE_CUDNN): the causal
grouped-query attention of llmc/kernels/attention.cuh, forward and backward, through the cuDNN
frontend's fused SDPA graphs. It is a second implementation to measure our kernels against
and to cross-check them on a GPU (dev/cuda/attention_{forward,backward}.cu, test_attention);
the own kernels stay the default, and the trainers use cuDNN only when asked (--cudnn 1).

Same tensors and layout as llmc/kernels/attention.cuh, described to cuDNN as strided 4-D tensors:
    q: (B, T, Hq, hd) -> dims (B, Hq, T, hd), strides (T*Hq*hd, hd, Hq*hd, 1);  k, v likewise
    with Hkv heads; out/dout like q; lse: (B, Hq, T) float -> dims (B, Hq, T, 1), strides
    (Hq*T, T, 1, 1). cuDNN's "stats" are the natural-log logsumexp of each row's scaled scores,
    exactly our lse, so either forward pairs with either backward.
Only bf16, no document mask (cuDNN's masks are causal and padding, not "same document"),
and the head dims cuDNN supports (multiples of 8 up to 128 here): attention_cudnn_supports()
says whether a call can go here; the dispatcher in attention.cuh falls back to our kernels
otherwise. A shape cuDNN refuses when its graph is built (validation, support check, plans: it
depends on the cuDNN version and the GPU) is not fatal: that shape runs our kernels, and the
first refusal of each shape says why in one line (CudnnRefusals). The backward runs cuDNN's deterministic algorithm, so a resumed run stays
bit-exact. Graphs are built once per shape and cached; the workspace grows on demand.

Not compiled on the host backend (cuDNN has no CPU implementation); not run on a GPU yet.
*/
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <tuple>

// The shapes cuDNN refused, with the reason: asked before each call, so a refused shape costs
// one failed build and then a map lookup; the first refusal of a shape is noted on stderr.
// (Host-compiled too: test_attention checks it.)
struct CudnnRefusals {
    using Shape = std::tuple<int, int, int, int, int>;  // B, T, Hq, Hkv, hd
    std::map<std::tuple<bool, Shape>, std::string> reasons;  // key: (backward?, shape)

    bool refused(bool backward, const Shape& s) const { return reasons.count({backward, s}) != 0; }
    void refuse(bool backward, const Shape& s, const std::string& why) {
        if (!reasons.emplace(std::make_tuple(backward, s), why).second) { return; }
        fprintf(stderr, "cuDNN attention: %s of B %d T %d Hq %d Hkv %d hd %d refused (%s); our kernels run it\n",
                backward ? "backward" : "forward", std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s),
                std::get<4>(s), why.c_str());
    }
    static CudnnRefusals& get() {
        static CudnnRefusals r;
        return r;
    }
};

#if defined(ENABLE_CUDNN) && defined(__CUDACC__)

#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <tuple>

#include "llmc/cuda_common.h"
#include "llmc/kernels/attention_shape.h"  // defines: AttnShape, AttnTensors, AttnGrads
#include "llmc/utils.h"

namespace cudnn_attention {

namespace fe = cudnn_frontend;

// tensor ids in the graphs' variant packs
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

inline void check(fe::error_t status, const char* what) {
    if (status.is_bad()) { fatal("cuDNN attention: %s failed: %s", what, status.get_message().c_str()); }
}

inline cudnnHandle_t handle() {
    static cudnnHandle_t h = [] {
        cudnnHandle_t created;
        cudnnStatus_t status = cudnnCreate(&created);
        if (status != CUDNN_STATUS_SUCCESS) { fatal("cuDNN attention: cudnnCreate failed: %s", cudnnGetErrorString(status)); }
        return created;
    }();
    return h;
}

// a (B, T, H, hd) row-major tensor seen as (B, H, T, hd)
inline std::shared_ptr<fe::graph::Tensor_attributes> bthd_tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                                 int B, int T, int H, int hd) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, H, T, hd})
                        .set_stride({(int64_t)T * H * hd, hd, (int64_t)H * hd, 1}));
}
inline void set_bthd_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, int B, int T, int H,
                            int hd) {
    t->set_output(true).set_uid(uid).set_dim({B, H, T, hd}).set_stride({(int64_t)T * H * hd, hd, (int64_t)H * hd, 1});
}
inline std::vector<int64_t> lse_dims(int B, int T, int Hq) { return {B, Hq, T, 1}; }
inline std::vector<int64_t> lse_strides(int T, int Hq) { return {(int64_t)Hq * T, T, 1, 1}; }

inline std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

// Builds the graph's plans; "" on success, else the step that failed and cuDNN's message.
inline std::string finalize(fe::graph::Graph& g) {
    auto failed = [](fe::error_t status, const char* what) {  // (get_message is not const)
        return std::string(what) + ": " + status.get_message();
    };
    // (a fresh variable per step: assigning to an error_t is [[nodiscard]] in the frontend)
    fe::error_t validated = g.validate();
    if (validated.is_bad()) { return failed(validated, "graph validation"); }
    fe::error_t built = g.build_operation_graph(handle());
    if (built.is_bad()) { return failed(built, "build_operation_graph"); }
    fe::error_t planned = g.create_execution_plans({fe::HeurMode_t::A});
    if (planned.is_bad()) { return failed(planned, "create_execution_plans"); }
    fe::error_t supported = g.check_support(handle());
    if (supported.is_bad()) { return failed(supported, "check_support: this cuDNN does not support the shape"); }
    fe::error_t plans = g.build_plans(handle());
    if (plans.is_bad()) { return failed(plans, "build_plans"); }
    return "";
}

using Shape = std::tuple<int, int, int, int, int>;  // B, T, Hq, Hkv, hd
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The graph of `shape` from `cache`, built on first use: q, k, v as inputs, then
// add_rest(graph, q, k, v) adds the operation and its other tensors. nullptr: cuDNN refused
// the shape (CudnnRefusals has why).
template <typename AddRest>
fe::graph::Graph* cached_graph(std::map<Shape, std::shared_ptr<fe::graph::Graph>>& cache, const Shape& shape,
                               bool backward, AddRest add_rest) {
    if (CudnnRefusals::get().refused(backward, shape)) { return nullptr; }
    auto found = cache.find(shape);
    if (found != cache.end()) { return found->second.get(); }
    auto [B, T, Hq, Hkv, hd] = shape;
    auto g = new_graph();
    add_rest(*g, bthd_tensor(*g, "q", kQ, B, T, Hq, hd), bthd_tensor(*g, "k", kK, B, T, Hkv, hd),
             bthd_tensor(*g, "v", kV, B, T, Hkv, hd));
    std::string why = finalize(*g);
    if (!why.empty()) {
        CudnnRefusals::get().refuse(backward, shape, why);
        return nullptr;
    }
    return cache.emplace(shape, g).first->second.get();
}

inline fe::graph::Graph* forward_graph(const Shape& shape) {
    static std::map<Shape, std::shared_ptr<fe::graph::Graph>> cache;
    return cached_graph(cache, shape, false, [&](fe::graph::Graph& g, TensorPtr q, TensorPtr k, TensorPtr v) {
        auto [B, T, Hq, Hkv, hd] = shape;
        auto options = fe::graph::SDPA_attributes()
                           .set_name("attention_forward")
                           .set_generate_stats(true)
                           .set_causal_mask(true)
                           .set_attn_scale(1.0f / sqrtf((float)hd));
        auto [o, stats] = g.sdpa(q, k, v, options);
        set_bthd_output(o, kO, B, T, Hq, hd);
        stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(lse_dims(B, T, Hq))
            .set_stride(lse_strides(T, Hq));
    });
}

inline fe::graph::Graph* backward_graph(const Shape& shape) {
    static std::map<Shape, std::shared_ptr<fe::graph::Graph>> cache;
    return cached_graph(cache, shape, true, [&](fe::graph::Graph& g, TensorPtr q, TensorPtr k, TensorPtr v) {
        auto [B, T, Hq, Hkv, hd] = shape;
        auto o = bthd_tensor(g, "o", kO, B, T, Hq, hd);
        auto dout = bthd_tensor(g, "dout", kDO, B, T, Hq, hd);
        auto stats = g.tensor(fe::graph::Tensor_attributes()
                                  .set_name("lse")
                                  .set_uid(kStats)
                                  .set_dim(lse_dims(B, T, Hq))
                                  .set_stride(lse_strides(T, Hq))
                                  .set_data_type(fe::DataType_t::FLOAT));
        auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_causal_mask(true)
                           .set_attn_scale(1.0f / sqrtf((float)hd))
                           .set_deterministic_algorithm(true);
        auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, options);
        set_bthd_output(dq, kDQ, B, T, Hq, hd);
        set_bthd_output(dk, kDK, B, T, Hkv, hd);
        set_bthd_output(dv, kDV, B, T, Hkv, hd);
    });
}

// one workspace for every graph, grown when a graph needs more
inline void* workspace(int64_t bytes) {
    static void* buffer = nullptr;
    static int64_t size = 0;
    if (bytes > size) {
        if (buffer) { cudaCheck(cudaFree(buffer)); }
        cudaCheck(cudaMalloc(&buffer, bytes));
        size = bytes;
    }
    return buffer;
}

inline void execute(fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream,
                    const char* what) {
    if (cudnnSetStream(handle(), stream) != CUDNN_STATUS_SUCCESS) { fatal("cuDNN attention: cudnnSetStream failed"); }
    int64_t bytes = 0;
    check(g.get_workspace_size(bytes), "get_workspace_size");
    check(g.execute(handle(), pack, workspace(bytes)), what);
}

}  // namespace cudnn_attention

// Whether attention_*_cudnn can run this call (bf16, no document mask, hd a multiple of 8 up to 128).
inline bool attention_cudnn_supports(const int* doc_ids, int hd) {
    return PRECISION_MODE == PrecisionMode::BF16 && doc_ids == nullptr && hd % 8 == 0 && hd <= 128;
}

// The tensors and shapes of llmc/kernels/attention.cuh's entry points (t.stats: the lse; the
// document ids must be null: attention_cudnn_supports). False: cuDNN refused the shape (noted
// once), nothing ran, and the caller runs our kernels.
inline bool attention_forward_cudnn(const AttnShape& s, const AttnTensors& t, cudaStream_t stream) {
    using namespace cudnn_attention;
    fe::graph::Graph* graph = forward_graph({s.B, s.T, s.Hq, s.Hkv, s.hd});
    if (graph == nullptr) { return false; }
    std::unordered_map<int64_t, void*> pack = {
        {kQ, (void*)t.q}, {kK, (void*)t.k}, {kV, (void*)t.v}, {kO, (void*)t.out}, {kStats, (void*)t.stats}};
    execute(*graph, pack, stream, "forward");
    return true;
}

inline bool attention_backward_cudnn(const AttnShape& s, const AttnTensors& t, const AttnGrads& g, cudaStream_t stream) {
    using namespace cudnn_attention;
    fe::graph::Graph* graph = backward_graph({s.B, s.T, s.Hq, s.Hkv, s.hd});
    if (graph == nullptr) { return false; }
    std::unordered_map<int64_t, void*> pack = {{kQ, (void*)t.q},   {kK, (void*)t.k},      {kV, (void*)t.v},
                                               {kO, (void*)t.out}, {kDO, (void*)g.dout},  {kStats, (void*)t.stats},
                                               {kDQ, (void*)g.dq}, {kDK, (void*)g.dk},    {kDV, (void*)g.dv}};
    execute(*graph, pack, stream, "backward");
    return true;
}

#endif  // ENABLE_CUDNN && __CUDACC__
