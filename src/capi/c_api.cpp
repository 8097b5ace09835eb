// The C ABI (include/xmoe/c_api.h) over MoeLayer and the generation engine: DLPack views in, DLPack managed
// tensors out, exceptions turned into an error code and a per-thread message.
#include "xmoe/c_api.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "llm/chat_setup.hpp"
#include "llm/engine.hpp"
#include "llm/model_bundle.hpp"
#include "util/random.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"
#ifdef XMOE_HAVE_MPI
#include "xmoe/mpi.hpp"
#endif

struct xmoe_layer {
  xmoe::MoeLayer layer;
};

struct xmoe_comm {
  explicit xmoe_comm(std::shared_ptr<xmoe::Communicator> c) : comm(std::move(c)), name(comm->name()) {}
  std::shared_ptr<xmoe::Communicator> comm;
  std::string name;
};

struct xmoe_mpi_session {
#ifdef XMOE_HAVE_MPI
  xmoe::MpiSession session;
#endif
};

struct xmoe_llm {
  xmoe::llm::ModelBundle bundle;
};

struct xmoe_generations {
  std::vector<xmoe::llm::GenerationResult> results;
};

namespace {

using xmoe::DType;
using xmoe::Error;
using xmoe::Shape;
using xmoe::Tensor;

thread_local std::string last_error;

// Runs f, turning an exception into -1 and the thread's error message.
template <class F>
int guarded(F&& f) {
  try {
    f();
    last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return -1;
}

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
  }
  throw Error("dtype: unsupported");
}

DType xmoe_dtype(DLDataType d, const char* what) {
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 32) return DType::f32;
  if (d.lanes == 1 && d.code == kDLFloat && d.bits == 64) return DType::f64;
  if (d.lanes == 1 && d.code == kDLBfloat && d.bits == 16) return DType::bf16;
  throw Error(std::string(what) + ": dtype (code " + std::to_string(d.code) + ", " + std::to_string(d.bits) +
              " bits) is not float32, float64 or bfloat16");
}

// A non-owning Tensor over a contiguous CPU DLTensor.
Tensor view_of(const DLTensor* t, const char* what) {
  XMOE_CHECK(t != nullptr, what, ": missing tensor");
  XMOE_CHECK(t->device.device_type == kDLCPU, what,
             ": only CPU tensors are supported (xmoe has no CUDA backend yet), got DLPack device type ",
             static_cast<int>(t->device.device_type));
  XMOE_CHECK(t->ndim >= 0 && t->ndim <= xmoe::kMaxDims, what, ": at most ", xmoe::kMaxDims,
             " dims are supported, got ", t->ndim);
  const DType dtype = xmoe_dtype(t->dtype, what);
  const Shape shape(std::span<const int64_t>(t->shape, static_cast<size_t>(t->ndim)));
  if (t->strides) {
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      XMOE_CHECK(t->shape[i] == 1 || t->strides[i] == expected, what, ": must be contiguous (row-major)");
      expected *= t->shape[i];
    }
  }
  XMOE_CHECK(t->data != nullptr || shape.numel() == 0, what, ": null data");
  return Tensor::wrap(static_cast<char*>(t->data) + t->byte_offset, shape, dtype, nullptr);
}

// A contiguous CPU DLTensor as (data, element count, element type), for the communicator's collectives.
struct RawBuffer {
  void* data = nullptr;
  size_t count = 0;
  xmoe::ElementType type = xmoe::ElementType::u8;
};

RawBuffer raw_buffer_of(const DLTensor* t, const char* what) {
  XMOE_CHECK(t != nullptr, what, ": missing tensor");
  XMOE_CHECK(t->device.device_type == kDLCPU, what,
             ": only CPU tensors are supported, got DLPack device type ",
             static_cast<int>(t->device.device_type));
  RawBuffer b;
  const DLDataType d = t->dtype;
  XMOE_CHECK(d.lanes == 1, what, ": vector dtypes are not supported");
  if (d.code == kDLFloat && d.bits == 32)
    b.type = xmoe::ElementType::f32;
  else if (d.code == kDLFloat && d.bits == 64)
    b.type = xmoe::ElementType::f64;
  else if (d.code == kDLBfloat && d.bits == 16)
    b.type = xmoe::ElementType::bf16;
  else if (d.code == kDLInt && d.bits == 32)
    b.type = xmoe::ElementType::i32;
  else if (d.code == kDLInt && d.bits == 64)
    b.type = xmoe::ElementType::i64;
  else if ((d.code == kDLUInt || d.code == kDLInt) && d.bits == 8)
    b.type = xmoe::ElementType::u8;
  else
    throw Error(std::string(what) + ": dtype (code " + std::to_string(d.code) + ", " +
                std::to_string(d.bits) + " bits) is not float32, float64, bfloat16, int32, int64 or 8-bit");
  int64_t n = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    XMOE_CHECK(!t->strides || t->shape[i] == 1 || t->strides[i] == n, what,
               ": must be contiguous (row-major)");
    n *= t->shape[i];
  }
  XMOE_CHECK(t->data != nullptr || n == 0, what, ": null data");
  b.data = static_cast<char*>(t->data) + t->byte_offset;
  b.count = static_cast<size_t>(n);
  return b;
}

// A DLManagedTensor that owns a Tensor (its storage stays alive until the consumer calls the deleter).
struct Managed {
  DLManagedTensor dl{};
  Tensor tensor;
  std::vector<int64_t> shape;
};

DLManagedTensor* export_tensor(Tensor t) {
  auto m = std::make_unique<Managed>();
  m->tensor = std::move(t);
  m->shape.assign(m->tensor.shape().dims().begin(), m->tensor.shape().dims().end());
  DLTensor& d = m->dl.dl_tensor;
  d.data = m->tensor.raw();
  d.device = {kDLCPU, 0};
  d.ndim = m->tensor.ndim();
  d.dtype = dl_dtype(m->tensor.dtype());
  d.shape = m->shape.data();
  d.strides = nullptr;
  d.byte_offset = 0;
  m->dl.manager_ctx = m.get();
  m->dl.deleter = [](DLManagedTensor* self) { delete static_cast<Managed*>(self->manager_ctx); };
  return &m.release()->dl;
}

xmoe::Parameter& param_at(xmoe_layer* layer, int64_t i) {
  const auto params = layer->layer.parameters();
  XMOE_CHECK(i >= 0 && i < static_cast<int64_t>(params.size()), "parameter index ", i, " out of range [0, ",
             params.size(), ")");
  return *params[static_cast<size_t>(i)];
}

void rebind_checked(Tensor& slot, const DLTensor* t, const std::string& what) {
  if (!t) return;
  Tensor v = view_of(t, what.c_str());
  XMOE_CHECK(v.dtype() == slot.dtype(), what, ": dtype ", xmoe::dtype_name(v.dtype()), ", expected ",
             xmoe::dtype_name(slot.dtype()));
  XMOE_CHECK(v.shape() == slot.shape(), what, ": shape ", v.shape().str(), ", expected ", slot.shape().str());
  slot = v;
}

}  // namespace

extern "C" {

int32_t xmoe_c_api_version(void) {
  return XMOE_C_API_VERSION;
}

const char* xmoe_last_error(void) {
  return last_error.c_str();
}

void xmoe_layer_config_init(xmoe_layer_config* c) {
  const xmoe::MoeConfig d;
  c->gate_type = "top";
  c->k = d.gate.k;
  c->capacity_factor = d.gate.capacity_factor;
  c->gate_noise = d.gate.gate_noise;
  c->fp32_gate = d.gate.fp32_gate;
  c->proj_dim = d.gate.proj_dim;
  c->init_t = d.gate.init_t;
  c->model_dim = 0;
  c->expert_type = "ffn";
  c->num_experts = d.experts.num_experts;
  c->hidden_size = 0;
  c->output_dim = 0;
  c->activation = "relu";
  c->has_fc1_bias = d.experts.has_fc1_bias;
  c->has_fc2_bias = d.experts.has_fc2_bias;
  c->dtype = dl_dtype(d.dtype);
  c->is_postscore = d.is_postscore;
  c->batch_prioritized_routing = d.batch_prioritized_routing;
  c->normalize_gate = d.normalize_gate;
  c->is_gshard_loss = d.is_gshard_loss;
  c->capacity_alignment = d.capacity_alignment;
  c->seed_gate = d.seed_gate;
  c->seed_experts = d.seed_experts;
  c->isa = nullptr;
  c->adaptive_r = d.adaptive_r;
  c->a2a_overlap_degree = d.a2a_overlap_degree;
  c->use_2dh = d.use_2dh;
  c->local_size = d.local_size;
}

int xmoe_layer_create(const xmoe_layer_config* c, xmoe_layer** out) {
  return xmoe_layer_create_in_group(c, nullptr, out);
}

int xmoe_layer_create_in_group(const xmoe_layer_config* c, xmoe_comm* group, xmoe_layer** out) {
  return guarded([&] {
    XMOE_CHECK(c && out, "xmoe_layer_create: null argument");
    xmoe::MoeConfig m;
    m.gate.type = c->gate_type ? c->gate_type : "";
    m.gate.k = c->k;
    m.gate.capacity_factor = c->capacity_factor;
    m.gate.gate_noise = c->gate_noise;
    m.gate.fp32_gate = c->fp32_gate != 0;
    m.gate.proj_dim = c->proj_dim;
    m.gate.init_t = c->init_t;
    m.model_dim = c->model_dim;
    m.experts.type = c->expert_type ? c->expert_type : "";
    m.experts.num_experts = c->num_experts;
    m.experts.hidden_size = c->hidden_size;
    m.experts.output_dim = c->output_dim;
    m.experts.activation = c->activation ? c->activation : "";
    m.experts.has_fc1_bias = c->has_fc1_bias != 0;
    m.experts.has_fc2_bias = c->has_fc2_bias != 0;
    XMOE_CHECK(m.experts.type != "custom",
               "experts.type: custom experts are not reachable through the C ABI");
    m.dtype = xmoe_dtype(c->dtype, "dtype");
    m.is_postscore = c->is_postscore != 0;
    m.batch_prioritized_routing = c->batch_prioritized_routing != 0;
    m.normalize_gate = c->normalize_gate != 0;
    m.is_gshard_loss = c->is_gshard_loss != 0;
    m.capacity_alignment = c->capacity_alignment;
    m.seed_gate = c->seed_gate;
    m.seed_experts = c->seed_experts;
    m.isa = c->isa ? c->isa : "";
    m.adaptive_r = c->adaptive_r;
    m.a2a_overlap_degree = c->a2a_overlap_degree;
    m.use_2dh = c->use_2dh != 0;
    m.local_size = c->local_size;
    XMOE_CHECK(m.a2a_overlap_degree >= 1, "a2a_overlap_degree: must be >= 1, got ", m.a2a_overlap_degree);
    XMOE_CHECK(m.local_size >= 0, "local_size: must be >= 0 (0 = LOCAL_SIZE), got ", m.local_size);
    *out = new xmoe_layer{xmoe::MoeLayer(m, group ? group->comm : nullptr)};
  });
}

void xmoe_layer_destroy(xmoe_layer* layer) {
  delete layer;
}

int64_t xmoe_layer_num_params(const xmoe_layer* layer) {
  return static_cast<int64_t>(const_cast<xmoe_layer*>(layer)->layer.parameters().size());
}

int64_t xmoe_layer_output_dim(const xmoe_layer* layer) {
  return layer->layer.output_dim();
}

const char* xmoe_layer_kernel_isa(const xmoe_layer* layer) {
  return layer->layer.kernel_isa();
}

int xmoe_layer_param(xmoe_layer* layer, int64_t i, const char** name, int32_t* is_expert, DLTensor* value) {
  return guarded([&] {
    xmoe::Parameter& p = param_at(layer, i);
    if (name) *name = p.name.c_str();
    if (is_expert) *is_expert = p.is_expert;
    if (value) {
      value->data = p.value.raw();
      value->device = {kDLCPU, 0};
      value->ndim = p.value.ndim();
      value->dtype = dl_dtype(p.value.dtype());
      value->shape = const_cast<int64_t*>(p.value.shape().dims().data());
      value->strides = nullptr;
      value->byte_offset = 0;
    }
  });
}

int xmoe_layer_bind_param(xmoe_layer* layer, int64_t i, const DLTensor* value, const DLTensor* grad) {
  return guarded([&] {
    xmoe::Parameter& p = param_at(layer, i);
    // Check both before changing either, so a bad call keeps the old binding.
    Tensor v = p.value, g = p.grad;
    rebind_checked(v, value, "parameter '" + p.name + "'");
    rebind_checked(g, grad, "gradient of '" + p.name + "'");
    p.value = v;
    p.grad = g;
  });
}

void xmoe_switches_init(xmoe_switches* s) {
  *s = xmoe_switches{};
  s->training = 1;
  s->adaptive_r = -1;
}

int xmoe_layer_forward(xmoe_layer* layer, const DLTensor* x, const xmoe_switches* s, DLManagedTensor** y,
                       double* l_aux) {
  return guarded([&] {
    XMOE_CHECK(y, "xmoe_layer_forward: null output");
    xmoe::Switches sw;
    Tensor noise;
    if (s) {
      sw.top_k = s->top_k;
      if (s->has_capacity_factor) sw.capacity_factor = s->capacity_factor;
      sw.execution = s->grouped ? xmoe::ExpertExecution::grouped : xmoe::ExpertExecution::padded;
      sw.training = s->training != 0;
      if (s->noise) {
        noise = view_of(s->noise, "noise");
        sw.noise = &noise;
      }
      if (s->adaptive_r >= 0) sw.adaptive_r = s->adaptive_r;
      sw.a2a_overlap_degree = s->a2a_overlap_degree;
    }
    xmoe::ForwardResult r = layer->layer.forward(view_of(x, "x"), sw);
    if (l_aux) *l_aux = r.aux_loss;
    *y = export_tensor(std::move(r.y));
  });
}

int xmoe_layer_backward(xmoe_layer* layer, const DLTensor* dy, double daux, DLManagedTensor** dx) {
  return guarded([&] {
    XMOE_CHECK(dx, "xmoe_layer_backward: null output");
    *dx = export_tensor(layer->layer.backward(view_of(dy, "dy"), daux));
  });
}

int xmoe_fill_normal(uint64_t seed, uint64_t stream, DLTensor* out) {
  return guarded([&] {
    Tensor t = view_of(out, "out");
    const xmoe::CounterRng rng(seed, stream);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.normal(static_cast<uint64_t>(i)));
  });
}

int32_t xmoe_mpi_available(void) {
#ifdef XMOE_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

int xmoe_mpi_session_create(xmoe_mpi_session** out) {
  return guarded([&] {
    XMOE_CHECK(out, "xmoe_mpi_session_create: null argument");
#ifdef XMOE_HAVE_MPI
    *out = new xmoe_mpi_session{};
#else
    throw Error(
        "MPI: this xmoe was built without MPI (install Open MPI, e.g. Debian's libopenmpi-dev, and rebuild)");
#endif
  });
}

void xmoe_mpi_session_destroy(xmoe_mpi_session* session) {
  delete session;
}

int xmoe_mpi_session_world(xmoe_mpi_session* session, xmoe_comm** out) {
  return guarded([&] {
    XMOE_CHECK(session && out, "xmoe_mpi_session_world: null argument");
#ifdef XMOE_HAVE_MPI
    *out = new xmoe_comm(session->session.world());
#else
    throw Error("MPI: this xmoe was built without MPI");
#endif
  });
}

int32_t xmoe_comm_rank(const xmoe_comm* comm) {
  return comm->comm->rank();
}

int32_t xmoe_comm_size(const xmoe_comm* comm) {
  return comm->comm->size();
}

const char* xmoe_comm_name(const xmoe_comm* comm) {
  return comm->name.c_str();
}

int xmoe_comm_split(xmoe_comm* comm, int32_t color, int32_t key, xmoe_comm** out) {
  return guarded([&] {
    XMOE_CHECK(comm && out, "xmoe_comm_split: null argument");
    XMOE_CHECK(color >= 0, "color: must be >= 0, got ", color);
    *out = new xmoe_comm(comm->comm->split(color, key));
  });
}

void xmoe_comm_destroy(xmoe_comm* comm) {
  delete comm;
}

int xmoe_comm_all_reduce(xmoe_comm* comm, DLTensor* data, const char* op) {
  return guarded([&] {
    XMOE_CHECK(comm && op, "xmoe_comm_all_reduce: null argument");
    const RawBuffer b = raw_buffer_of(data, "all_reduce");
    const std::string name = op;
    xmoe::ReduceOp r = xmoe::ReduceOp::sum;
    if (name == "max")
      r = xmoe::ReduceOp::max;
    else if (name == "min")
      r = xmoe::ReduceOp::min;
    else
      XMOE_CHECK(name == "sum", "op: expected sum, max or min, got '", name, "'");
    comm->comm->all_reduce(b.data, b.data, b.count, b.type, r);
  });
}

int xmoe_comm_broadcast(xmoe_comm* comm, DLTensor* data, int32_t root) {
  return guarded([&] {
    XMOE_CHECK(comm, "xmoe_comm_broadcast: null argument");
    XMOE_CHECK(root >= 0 && root < comm->comm->size(), "root: ", root, " is not a rank of group '",
               comm->comm->name(), "' (size ", comm->comm->size(), ")");
    const RawBuffer b = raw_buffer_of(data, "broadcast");
    comm->comm->broadcast(b.data, b.count, b.type, root);
  });
}

int xmoe_comm_barrier(xmoe_comm* comm) {
  return guarded([&] {
    XMOE_CHECK(comm, "xmoe_comm_barrier: null argument");
    comm->comm->barrier();
  });
}

int xmoe_llm_open(const char* model_dir, const char* dtype, const char* isa, xmoe_llm** out) {
  return guarded([&] {
    XMOE_CHECK(model_dir && out, "xmoe_llm_open: null argument");
    auto llm = std::make_unique<xmoe_llm>(xmoe_llm{xmoe::llm::ModelBundle::open(model_dir)});
    llm->bundle.load_weights(xmoe::parse_dtype(dtype ? dtype : "bf16"), isa ? isa : "");
    *out = llm.release();
  });
}

void xmoe_llm_destroy(xmoe_llm* llm) {
  delete llm;
}

void xmoe_generation_request_init(xmoe_generation_request* r) {
  *r = xmoe_generation_request{};
  r->max_tokens = 256;
}

int xmoe_llm_generate(xmoe_llm* llm, const xmoe_generation_request* requests, int64_t count,
                      xmoe_generations** out) {
  return guarded([&] {
    XMOE_CHECK(llm && out && (requests || count == 0) && count >= 0, "xmoe_llm_generate: bad arguments");
    namespace L = xmoe::llm;
    const L::ModelBundle& b = llm->bundle;
    L::EngineOptions options;
    options.eos_token_ids = b.chat.eos_token_ids;
    if (b.tokenizer) options.text_stream = L::tokenizer_text_stream(*b.tokenizer);
    options.max_running = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(count, 64)));
    L::Engine engine(*b.model, options);
    std::vector<L::RequestId> ids;
    for (int64_t i = 0; i < count; ++i) {
      const xmoe_generation_request& q = requests[i];
      L::GenerationRequest r;
      if (q.prompt) {
        r.prompt = b.require_tokenizer("a text prompt (give token ids instead)")
                       .encode(q.prompt, /*add_special_tokens=*/true);
      } else {
        XMOE_CHECK(q.prompt_ids && q.num_prompt_ids > 0, "request ", i, ": empty prompt");
        r.prompt.assign(q.prompt_ids, q.prompt_ids + q.num_prompt_ids);
      }
      L::apply_generation_defaults(b.chat, r.sampling);
      if (q.has_temperature) r.sampling.temperature = q.temperature;
      if (q.has_seed) r.sampling.seed = q.seed;
      r.sampling.validate();
      r.max_tokens = q.max_tokens;
      r.ignore_eos = q.ignore_eos != 0;
      ids.push_back(engine.submit(std::move(r)));
    }
    engine.run_until_idle();
    auto g = std::make_unique<xmoe_generations>();
    for (L::RequestId id : ids) g->results.push_back(engine.take_result(id));
    *out = g.release();
  });
}

int64_t xmoe_generations_count(const xmoe_generations* g) {
  return static_cast<int64_t>(g->results.size());
}

const int32_t* xmoe_generations_ids(const xmoe_generations* g, int64_t i, int64_t* count) {
  const auto& r = g->results.at(static_cast<size_t>(i));
  if (count) *count = static_cast<int64_t>(r.token_ids.size());
  return r.token_ids.data();
}

const char* xmoe_generations_text(const xmoe_generations* g, int64_t i, size_t* length) {
  const auto& r = g->results.at(static_cast<size_t>(i));
  if (length) *length = r.text.size();
  return r.text.c_str();
}

const char* xmoe_generations_finish_reason(const xmoe_generations* g, int64_t i) {
  return xmoe::llm::finish_reason_name(g->results.at(static_cast<size_t>(i)).finish);
}

void xmoe_generations_destroy(xmoe_generations* g) {
  delete g;
}

}  // extern "C"
